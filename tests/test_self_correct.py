"""inferlets/self-correct on SmolLM2: a rejected answer is rewound to the snapshot's exact K/V.

After every rewind the inferlet reads the distribution after the rewound context and decodes greedily
from it (--probe); both must be what the inference process gives for the snapshot's tokens forwarded
from scratch, and each retry must sample what a fresh instance seeded alike samples after a fresh
prefill. A context whose earlier K/V differ (one prompt token changed) gives a distribution outside
the tolerance, so matching it means the rewound K/V are the snapshot's.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from harness import assert_pools_full, direct_greedy, messages, refused, run, tiny_inference
from oven.proto import inference as p

PROMPT = "How many legs does a spider have? Answer with a number."
NEVER = r"\d{40}"  # no answer of 24 tokens matches
BASE = [PROMPT, "--chat", "--max-tokens", "24"]
PROBE = 8
TOLERANCE = 1e-5  # on probabilities: the same tokens forwarded in other chunks
PROGRAMS = ["self-correct"]


@pytest.fixture(scope="module")
def inference():
    with tiny_inference(model="smollm2-135m-instruct") as process:
        yield process


def reports(loop, args_list: list[list[str]]) -> list[dict]:
    instances = run(loop, "self-correct", args_list)
    assert [i.exit_code for i in instances] == [0] * len(instances), [i.error for i in instances]
    return [json.loads(m) for i in instances for m in messages(loop, i)]


def host_dist(inference, tokens: list[int], page_size: int, top_k: int = 8) -> tuple[list[int], np.ndarray]:
    """The top-k after ``tokens`` forwarded at once on pages of nobody's (the pool is full between runs)."""
    pages = list(range(-(-len(tokens) // page_size)))
    item = p.ForwardTextItem(tokens, list(range(len(tokens))), pages, len(tokens) - (len(pages) - 1) * page_size,
                             [len(tokens) - 1], top_k)
    with inference.client() as client:
        reply = client.call(p.ForwardTextRequest([item]))
    assert reply.errors == [None]
    ((dist,),) = reply.dists
    return np.frombuffer(dist.token_ids, "<i4").tolist(), np.frombuffer(dist.probs, "<f4")


def assert_rewound_to(inference, loop, report: dict) -> None:
    """Every rewind in ``report`` left the snapshot's pages and exactly its K/V."""
    snapshot, page_size = report["snapshot"], loop.info.page_size
    ids, probs = host_dist(inference, snapshot, page_size)
    greedy = direct_greedy(inference, loop, snapshot, PROBE)
    for rewind in report["rewinds"]:
        assert rewind["pages"] == -(-len(snapshot) // page_size)
        assert rewind["dist"]["ids"] == ids
        assert np.allclose(rewind["dist"]["probs"], probs, rtol=0, atol=TOLERANCE)
        assert rewind["probe"][:len(greedy)] == greedy  # greedy stops at an end token, the probe does not
    # the check can fail: the K/V of a prompt with one token changed give another distribution
    other = snapshot[:5] + [snapshot[5] + 1] + snapshot[6:]
    assert not np.allclose(host_dist(inference, other, page_size)[1], probs, rtol=0, atol=TOLERANCE)


def test_a_rewind_restores_the_snapshots_kv_and_retries_sample_as_after_a_fresh_prefill(loop, inference):
    rewinding, *fresh = reports(loop, [BASE + ["--pattern", NEVER, "--attempts", "3", "--probe", str(PROBE)]]
                                + [BASE + ["--pattern", NEVER, "--attempts", "1", "--seed", str(k)] for k in (1, 2)])
    snapshot, attempts, page_size = rewinding["snapshot"], rewinding["attempts"], loop.info.page_size
    snapshot_pages = -(-len(snapshot) // page_size)
    assert len(snapshot) % page_size  # the snapshot ends inside a page the answers wrote on ...
    assert rewinding["answer"] is None
    assert [(a["seed"], a["accepted"]) for a in attempts] == [(0, False), (1, False), (2, False)]
    assert all(len(snapshot) + len(a["tokens"]) > snapshot_pages * page_size for a in attempts)  # ... and past it
    assert len({tuple(a["tokens"]) for a in attempts}) == 3
    assert len(rewinding["rewinds"]) == 3
    assert_rewound_to(inference, loop, rewinding)
    for attempt, report in zip(attempts[1:], fresh):
        assert report["snapshot"] == snapshot
        assert report["rewinds"] == [{"pages": snapshot_pages, "probe": [], "dist": None}]
        assert report["attempts"][0]["tokens"] == attempt["tokens"]  # seed k after k rewinds = seed k fresh
    assert_pools_full(loop)


def test_the_first_accepted_answer_ends_the_attempts(loop, inference):
    (second,) = reports(loop, [BASE + ["--pattern", NEVER, "--attempts", "1", "--seed", "1"]])
    text = second["attempts"][0]["text"]
    accepts_second, accepts_any = reports(loop, [BASE + ["--pattern", re.escape(text.strip()), "--probe", "2"],
                                                 BASE + ["--pattern", r"(?s).*"]])
    assert [a["accepted"] for a in accepts_second["attempts"]] == [False, True]
    assert accepts_second["answer"] == text and accepts_second["attempts"][1]["text"] == text
    assert len(accepts_second["rewinds"]) == 1
    assert [a["accepted"] for a in accepts_any["attempts"]] == [True] and accepts_any["rewinds"] == []
    assert accepts_any["answer"] == accepts_any["attempts"][0]["text"]
    assert_pools_full(loop)


def test_the_models_own_judgement_rewinds_alike(loop, inference):
    (judged,) = reports(loop, [BASE + ["--judge", "--attempts", "3", "--probe", str(PROBE)]])
    verdicts = [a["accepted"] for a in judged["attempts"]]
    assert verdicts in ([True], [False, True], [False, False, True], [False, False, False])
    assert len(judged["rewinds"]) == verdicts.count(False)
    assert judged["answer"] == (judged["attempts"][-1]["text"] if verdicts[-1] else None)
    # the judge forked the context holding the answer: its pages were shared, the rewind is exact all the same
    assert_rewound_to(inference, loop, judged)
    assert_pools_full(loop)


def test_bad_arguments_are_refused(loop):
    cases = {("p",): "one of the arguments --pattern --judge is required",
             ("p", "--pattern", "x", "--judge"): "argument --judge: not allowed with argument --pattern",
             ("p", "--pattern", "("):
                 "argument --pattern: not a regular expression: missing ), unterminated subpattern at position 0",
             ("p", "--judge", "--attempts", "0"): "argument --attempts: expected a whole number >= 1, not '0'",
             ("p", "--judge", "--attempts"): "argument --attempts: expected one argument",
             ("p", "--judge", "--hint", "x"): "unrecognized arguments: --hint x",
             ("--judge",): "the following arguments are required: PROMPT"}
    for stderr, error in zip(refused(loop, "self-correct", [list(args) for args in cases]), cases.values()):
        assert stderr.startswith("usage: self-correct [-h]") and stderr.endswith(f"self-correct: error: {error}\n")
