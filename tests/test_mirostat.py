"""inferlets/mirostat against Mirostat v2 redone here over the whole vocabulary, on SmolLM2.

The reference is driven from here one step at a time straight from the inference process (a fresh
context forwarded as the SDK does it: the prompt but its last token, then one token per forward, so
the probabilities are the very floats the inferlet saw), asking every step for the full distribution
(the inferlet asks for only the top floor(2**mu) + 1: this checks that bound too). It truncates by
surprise over the whole vocabulary, draws with the SDK's seeded draw from the same generator, and
updates mu as the paper and llama.cpp do. The tokens and the number kept per step must be the
inferlet's exactly; surprise and mu to 1e-12 (bit-equal when written; each side takes log2 from its
own math library, wasi-libc's in the inferlet, glibc's here, which need not round the last bit alike).
"""

from __future__ import annotations

import json
import math

import pytest
from harness import NUM_PAGES, assert_pools_full, messages, refused, run

from oven.client.generate import PagedSequence
from oven.control.tokenizer import Tokenizer
from oven.inference.sampling import sdk
from oven.proto import inference as p

MODEL = "smollm2-135m-instruct"  # the tiny model's near-uniform distributions would keep one token every step
INFERENCE_MODEL = MODEL
PROGRAMS = ["mirostat"]
PROMPT = "The lighthouse keeper opened the door and"
MAX_TOKENS = 16


def mirostat(loop, *args: str) -> dict:
    (inst,) = run(loop, "mirostat", [[PROMPT, "--max-tokens", str(MAX_TOKENS), *args]])
    assert inst.exit_code == 0, inst.error
    (message,) = messages(loop, inst)
    return json.loads(message)


def host_mirostat(inference, loop, tau: float, eta: float, seed: int) -> dict:
    tok = Tokenizer(loop.info.tokenizer)
    rng, mu, out = sdk.Rng(seed), 2 * tau, {"tokens": [], "kept": [], "surprise": [], "mu": []}
    seq, prompt = PagedSequence(loop.info.page_size, list(range(NUM_PAGES))), tok.encode(PROMPT)
    with inference.client() as client:
        vocab, inputs = loop.info.vocab_size, prompt[-1:]
        # the prompt but its last token first, as the SDK's flush does: the same float sums, bit for bit
        pages, last_page_len = seq.extend(len(prompt) - 1)
        reply = client.call(p.ForwardTextRequest([p.ForwardTextItem(
            prompt[:-1], list(range(len(prompt) - 1)), pages, last_page_len, [], 0)]))
        assert reply.errors == [None]
        while len(out["tokens"]) < MAX_TOKENS and not (out["tokens"] and out["tokens"][-1] in tok.stop_token_ids):
            pages, last_page_len = seq.extend(len(inputs))
            positions = list(range(seq.num_tokens - len(inputs), seq.num_tokens))
            reply = client.call(p.ForwardTextRequest([p.ForwardTextItem(
                inputs, positions, pages, last_page_len, [len(inputs) - 1], vocab)]))
            assert reply.errors == [None]
            ids, probs = (list(memoryview(b).cast(f)) for b, f in ((reply.dists[0][0].token_ids, "i"),
                                                                    (reply.dists[0][0].probs, "f")))
            assert len(probs) == vocab
            kept = max(1, sum(1 for q in probs if q > 0 and -math.log2(q) <= mu))  # over all, not a prefix
            index = sdk.draw(probs, kept, 1.0, rng)
            total = 0.0
            for q in probs[:kept]:
                total += q
            surprise = -math.log2(probs[index] / total)
            mu = mu - eta * (surprise - tau)
            for key, value in (("tokens", ids[index]), ("kept", kept), ("surprise", surprise), ("mu", mu)):
                out[key].append(value)
            inputs = [ids[index]]
    out["text"] = tok.decode([t for t in out["tokens"] if t not in tok.stop_token_ids])
    return out


def assert_equal(got: dict, want: dict) -> None:
    assert (got["tokens"], got["kept"], got["text"]) == (want["tokens"], want["kept"], want["text"])
    assert got["surprise"] == pytest.approx(want["surprise"], abs=1e-12)
    assert got["mu"] == pytest.approx(want["mu"], abs=1e-12)


@pytest.mark.parametrize("tau, eta, seed", [(3.0, 0.1, 0), (5.0, 0.3, 7)])
def test_tokens_and_mu_equal_mirostat_redone_over_the_whole_vocabulary(loop, inference, tau, eta, seed):
    got = mirostat(loop, "--tau", str(tau), "--eta", str(eta), "--seed", str(seed))
    assert_equal(got, host_mirostat(inference, loop, tau, eta, seed))
    assert len(set(got["kept"])) > 1 and max(got["kept"]) > 1  # the truncation moved and sampled among several
    assert_pools_full(loop)


def test_the_seed_fixes_the_tokens_and_another_changes_them(loop):
    first, again, other = (mirostat(loop, "--tau", "5", "--seed", s) for s in ("1", "1", "2"))
    assert again == first and other["tokens"] != first["tokens"]


@pytest.mark.parametrize("args, error", [
    ([], "the following arguments are required: PROMPT"),
    (["q", "--max-tokens", "0"], "argument --max-tokens: expected a whole number >= 1, not '0'"),
    (["q", "--tau", "0"], "argument --tau: expected a number > 0 and <= 64, not '0'"),
    (["q", "--eta", "2"], "argument --eta: expected a number > 0 and <= 1, not '2'"),
    (["q", "--tau", "nan"], "argument --tau: expected a number > 0 and <= 64, not 'nan'"),
    (["q", "--seed"], "argument --seed: expected one argument"),
    (["q", "--mu", "1"], "unrecognized arguments: --mu 1"),
])
def test_bad_arguments_are_refused(loop, args, error):
    (stderr,) = refused(loop, "mirostat", [args])
    assert stderr.startswith("usage: mirostat [-h] [--max-tokens M]") and stderr.endswith(f"mirostat: error: {error}\n")
