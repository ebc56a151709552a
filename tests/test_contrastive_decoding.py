"""inferlets/contrastive-decoding against the same contrast computed here from the inference process.

A LoRA adapter with random weights (written as `oven adapters add` stores it) stands in for the second
model. The reference forwards two fresh sequences straight from the inference process, one through the
adapter and one on the base model, as the SDK forwards them (the prompt but its last token, then one
token a step, both sequences in one batch), takes both whole-vocabulary distributions and picks, among
the tokens with p_expert >= alpha * max p_expert, the highest log p_expert - log p_amateur. That the
adapter's logits are PEFT's is tests/test_adapters.py's business; here the choice is checked. Tokens
and plausible-set sizes must be the inferlet's exactly, scores to 1e-9.
"""

from __future__ import annotations

import json
import math

import pytest
from conftest import write_adapter
from harness import NUM_PAGES, assert_pools_full, direct_greedy, messages, refused, run

from oven.client.generate import PagedSequence
from oven.control.tokenizer import Tokenizer
from oven.inference.models import resolve_model
from oven.proto import inference as p

PROMPT = "Once upon a time, in a land far away, there lived a"
ADAPTER, MAX_TOKENS = "expert-lora", 6
PROGRAMS = ["contrastive-decoding"]


@pytest.fixture(scope="module")
def loop_config(tmp_path_factory) -> dict:
    store = tmp_path_factory.mktemp("adapters")
    write_adapter(store / ADAPTER, resolve_model("tiny").config)
    return {"adapter_dir": str(store)}


def contrast(loop, *args: str) -> dict:
    args = [PROMPT, "--adapter", ADAPTER, "--max-tokens", str(MAX_TOKENS), *args]
    (inst,) = run(loop, "contrastive-decoding", [args])
    assert inst.exit_code == 0, inst.error
    (message,) = messages(loop, inst)
    return json.loads(message)


def host_contrast(inference, loop, expert_adapter: int, amateur_adapter: int, alpha: float) -> dict:
    tok = Tokenizer(loop.info.tokenizer)
    prompt, vocab, half = tok.encode(PROMPT), loop.info.vocab_size, NUM_PAGES // 2
    seqs = [PagedSequence(loop.info.page_size, list(range(i * half, (i + 1) * half))) for i in (0, 1)]
    adapters, out = (expert_adapter, amateur_adapter), {"tokens": [], "plausible": [], "scores": []}

    def forward(client, tokens: list[int], outputs: list[int], top_k: int) -> list:
        items = []
        for seq, adapter in zip(seqs, adapters):
            pages, last_page_len = seq.extend(len(tokens))
            items.append(p.ForwardTextItem(tokens, list(range(seq.num_tokens - len(tokens), seq.num_tokens)), pages,
                                           last_page_len, outputs, top_k, adapter_id=adapter))
        reply = client.call(p.ForwardTextRequest(items))
        assert reply.errors == [None, None]
        return [{t: q for t, q in zip(memoryview(d[0].token_ids).cast("i"), memoryview(d[0].probs).cast("f"))}
                for d in reply.dists] if outputs else []

    with inference.client() as client:
        forward(client, prompt[:-1], [], 0)
        inputs = prompt[-1:]
        while len(out["tokens"]) < MAX_TOKENS and not (out["tokens"] and out["tokens"][-1] in tok.stop_token_ids):
            expert, amateur = forward(client, inputs, [0], vocab)
            top = max(expert.values())
            plausible = [t for t, q in expert.items() if q >= alpha * top]
            scores = {t: math.log(expert[t]) - math.log(amateur[t]) for t in plausible}
            best = max(scores.values())
            (token,) = [t for t in plausible if scores[t] == best]  # a tie would need the tie rule: none here
            runner_up = max((s for t, s in scores.items() if t != token), default=-math.inf)
            assert best - runner_up > 1e-6, "the best two scores are within float noise: choose another prompt"
            for key, value in (("tokens", token), ("plausible", len(plausible)), ("scores", best)):
                out[key].append(value)
            inputs = [token]
    out["text"] = tok.decode([t for t in out["tokens"] if t not in tok.stop_token_ids])
    return out


def assert_equal(got: dict, want: dict) -> None:
    assert (got["tokens"], got["plausible"], got["text"]) == (want["tokens"], want["plausible"], want["text"])
    assert got["scores"] == pytest.approx(want["scores"], abs=1e-9)


@pytest.mark.parametrize("alpha", [0.1, 0.6])
def test_the_tokens_are_the_contrast_computed_on_the_host(loop, inference, alpha):
    (adapter,) = loop.adapters.entries()
    got = contrast(loop, "--alpha", str(alpha))
    assert_equal(got, host_contrast(inference, loop, adapter.adapter_id, 0, alpha))
    # the contrast is not the expert's greedy choice
    assert got["tokens"] != direct_greedy(inference, loop, PROMPT, MAX_TOKENS, adapter_id=adapter.adapter_id)
    assert_pools_full(loop)


def test_reversed_roles_and_alpha_one_is_the_experts_greedy(loop, inference):
    (adapter,) = loop.adapters.entries()
    got = contrast(loop, "--reverse")
    assert_equal(got, host_contrast(inference, loop, 0, adapter.adapter_id, 0.1))
    # alpha 1 leaves only the expert's most probable token: greedy on the expert
    greedy = contrast(loop, "--alpha", "1")
    assert greedy["plausible"] == [1] * len(greedy["tokens"])
    assert greedy["tokens"] == direct_greedy(inference, loop, PROMPT, MAX_TOKENS, adapter_id=adapter.adapter_id)
    assert_pools_full(loop)


@pytest.mark.parametrize("args, error", [
    ([], "the following arguments are required: PROMPT, --adapter"),
    (["q"], "the following arguments are required: --adapter"),
    (["q", "--adapter", ADAPTER, "--alpha", "1.5"], "argument --alpha: expected a number >= 0 and <= 1, not '1.5'"),
    (["q", "--adapter", ADAPTER, "--max-tokens", "0"], "argument --max-tokens: expected a whole number >= 1, not '0'"),
    (["q", "--adapter"], "argument --adapter: expected one argument"),
    (["q", "--adapter", ADAPTER, "--beta", "1"], "unrecognized arguments: --beta 1"),
])
def test_bad_arguments_are_refused(loop, args, error):
    (stderr,) = refused(loop, "contrastive-decoding", [args])
    assert stderr.startswith("usage: contrastive-decoding [-h] --adapter NAME [--max-tokens M]")
    assert stderr.endswith(f"contrastive-decoding: error: {error}\n")


def test_an_unknown_adapter_is_named(loop):
    (inst,) = run(loop, "contrastive-decoding", [["q", "--adapter", "no-such-adapter"]])
    assert inst.exit_code == 1
    assert inst.error == ("inferlet.tasks.OvenError: no adapter named 'no-such-adapter' on this server "
                          f"(it has: {ADAPTER})")
    assert_pools_full(loop)
