"""inferlets/jacobi-decoding: Jacobi iteration returns exactly greedy decoding's tokens in fewer forwards.

On SmolLM2, not the tiny random model: the tiny model's next token hardly depends on more than the
token before it, so K/V left behind by rejected guesses went unnoticed there. The reference replays
the algorithm straight on the inference process (the same forwards over the same tokens at the same
positions), so the rounds and what each accepted are known exactly; the tokens are checked against
plain greedy decoding as well.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from harness import NUM_PAGES, assert_pools_full, direct_greedy, messages, refused, run, tiny_inference

from oven.client.generate import PagedSequence
from oven.control.tokenizer import Tokenizer
from oven.proto import inference as p

PROGRAMS = ["jacobi-decoding"]  # stored in the module's ControlLoop (the `loop` fixture, conftest.py)

# (prompt, max new tokens, window): counting and code, where SmolLM2's guesses converge now and then.
COUNTING, CODE = "Count from 1 to 40: 1, 2, 3, 4, 5,", "def fibonacci(n):\n    if n <= 1:\n        return n\n    return"
CASES = [(COUNTING, 40, 4), (CODE, 40, 6), (COUNTING, 12, 0)]


@pytest.fixture(scope="module")
def inference():
    with tiny_inference(model="smollm2-135m-instruct") as process:
        yield process


def jacobi_reference(inference, tok: Tokenizer, page_size: int, prompt: str, max_new: int, window: int) -> dict:
    """The rounds the inferlet must make, replayed on the inference process: one forward of the anchor
    and its guesses a round, the sequence cut back to the accepted tokens after it."""
    seq = PagedSequence(page_size, list(range(NUM_PAGES)))
    end = tok.stop_token_ids

    def forward(tokens: list[int]) -> list[int]:
        start = seq.num_tokens
        pages, last_len = seq.extend(len(tokens))
        item = p.ForwardTextItem(tokens, list(range(start, seq.num_tokens)), pages, last_len,
                                 list(range(len(tokens))), top_k=1)
        with inference.client() as client:
            (dists,) = client.call(p.ForwardTextRequest([item])).dists
        return [int(np.frombuffer(d.token_ids, "<i4", count=1)[0]) for d in dists]

    out = [forward(tok.encode(prompt))[-1]]
    forwards, accepted, guesses = 1, [], []
    while len(out) < max_new and out[-1] not in end:
        size = min(window, max_new - len(out) - 1)
        guesses = (guesses + [out[-1]] * size)[:size]
        base = seq.num_tokens
        predicted = forward(out[-1:] + guesses)
        forwards += 1
        agree = next((i for i, (g, q) in enumerate(zip(guesses, predicted)) if g != q), len(guesses))
        new = predicted[:agree + 1]
        new = new[:next((i + 1 for i, t in enumerate(new) if t in end), len(new))]
        seq.num_tokens = base + 1 + min(agree, len(new))  # the anchor and the converged guesses
        out, guesses = out + new, predicted[agree + 1:]
        accepted.append(len(new))
    return {"tokens": out, "forward_calls": forwards, "accepted_per_round": accepted}


def test_tokens_are_greedy_in_fewer_forwards(loop, inference):
    instances = run(loop, "jacobi-decoding", [[prompt, str(max_new), "--window", str(window)]
                                              for prompt, max_new, window in CASES])
    assert all(i.exit_code == 0 for i in instances), [i.error for i in instances]
    tok = Tokenizer(loop.info.tokenizer)
    reports = [json.loads(messages(loop, inst)[0]) for inst in instances]
    for report, (prompt, max_new, window) in zip(reports, CASES):
        greedy = direct_greedy(inference, loop, prompt, max_new)
        assert report["tokens"] == greedy
        if window == 0:  # plain greedy: one forward a token
            assert report == {"tokens": greedy, "forward_calls": len(greedy), "accepted_per_round": []}
            continue
        assert report == jacobi_reference(inference, tok, loop.info.page_size, prompt, max_new, window)
        assert sum(report["accepted_per_round"]) == len(greedy) - 1  # the prefill gave the first
    # (forwards, tokens, most tokens one round accepted): both Jacobi cases needed fewer forwards than
    # tokens; plain greedy (the last) one a token.
    assert [(r["forward_calls"], len(r["tokens"]), max(r["accepted_per_round"], default=0)) for r in reports] == \
        [(32, 40, 4), (35, 40, 2), (12, 12, 0)]
    assert_pools_full(loop)


def test_bad_arguments_are_refused(loop):
    stderrs = refused(loop, "jacobi-decoding", [[], ["x", "ten"], ["x", "5", "--window"], ["x", "--window", "-1"],
                                                ["", "5"]])
    assert all(s.startswith("usage: jacobi-decoding [-h] [--window N] PROMPT [MAX_NEW_TOKENS]\n") for s in stderrs)
    assert [s.splitlines()[-1] for s in stderrs] == [
        "jacobi-decoding: error: the following arguments are required: PROMPT",
        "jacobi-decoding: error: argument MAX_NEW_TOKENS: expected a whole number >= 1, not 'ten'",
        "jacobi-decoding: error: argument --window: expected one argument",
        "jacobi-decoding: error: argument --window: expected a whole number >= 0, not '-1'",
        "jacobi-decoding: error: argument PROMPT: must not be empty",
    ]
    assert_pools_full(loop)
