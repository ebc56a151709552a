"""inferlets/skeleton-of-thought on SmolLM2: the skeleton is numbered points, and the points expanded
side by side on forks are, point for point, what expanding them one after another gives (--sequential,
one context rewound to the shared tokens after each point) and what greedy decoding of the same
tokens from scratch in the inference process gives."""

from __future__ import annotations

import json
import re

import pytest
from harness import assert_pools_full, control_loop, direct_greedy, messages, refused, run, tiny_inference
from oven.control.tokenizer import Tokenizer

QUESTION = "How can I improve my sleep?"
MAX_TOKENS = 16
PROGRAMS = ["skeleton-of-thought"]


@pytest.fixture(scope="module")
def inference():
    with tiny_inference(model="smollm2-135m-instruct") as process:
        yield process


@pytest.fixture(scope="module")
def loop(inference):
    # four forks of a ~200-token context, each with pages allocated ahead for its expansion
    with control_loop(inference, None, PROGRAMS, max_kv_pages_per_instance=96) as control:
        yield control


def reports(loop, args_list: list[list[str]]) -> list[dict]:
    instances = run(loop, "skeleton-of-thought", args_list)
    assert [i.exit_code for i in instances] == [0] * len(instances), [i.error for i in instances]
    return [json.loads(m) for i in instances for m in messages(loop, i)]


def assert_same_expansions(parallel: dict, sequential: dict) -> None:
    assert (parallel["mode"], sequential["mode"]) == ("parallel", "sequential")
    assert parallel["skeleton"] == sequential["skeleton"] and parallel["prefix"] == sequential["prefix"]
    for p, s in zip(parallel["expansions"], sequential["expansions"], strict=True):
        assert (p["point"], p["cue"], p["tokens"], p["text"]) == (s["point"], s["cue"], s["tokens"], s["text"])
    assert parallel["answer"] == sequential["answer"]


def test_parallel_expansion_equals_the_sequential_one_and_greedy_from_scratch(loop, inference):
    args = [QUESTION, "--points", "4", "--max-tokens", str(MAX_TOKENS)]
    parallel, sequential = reports(loop, [args, args + ["--sequential"]])
    points, tok = parallel["skeleton"], Tokenizer(loop.info.tokenizer)
    assert 2 <= len(points) <= 4, points
    assert all(re.fullmatch(r"\S.{1,59}", p) for p in points), points
    assert_same_expansions(parallel, sequential)
    expansions = parallel["expansions"]
    assert len({tuple(e["tokens"]) for e in expansions}) == len(points)  # each point its own continuation
    for i, (point, e) in enumerate(zip(points, expansions), 1):
        assert e["point"] == point and tok.decode(e["cue"]).endswith(f"<|im_start|>assistant\n{i}. {point}")
        assert len(e["tokens"]) <= MAX_TOKENS
        # the fork and the rewound context hold exactly the K/V of these tokens
        assert e["tokens"] == direct_greedy(inference, loop, parallel["prefix"] + e["cue"], MAX_TOKENS)
    assert parallel["answer"] == "\n".join(f"{i}. {e['point']}{e['text']}" for i, e in enumerate(expansions, 1))
    assert_pools_full(loop)


def test_a_given_skeleton_is_expanded_as_given(loop):
    skeleton = ["Keep a regular bedtime", "Avoid caffeine late in the day", "Make the bedroom dark and quiet"]
    args = [QUESTION, "--max-tokens", "8", "--skeleton", "|".join(skeleton)]
    parallel, sequential, again = reports(loop, [args, args + ["--sequential"], args])
    assert parallel["skeleton"] == skeleton
    assert_same_expansions(parallel, sequential)
    assert parallel["expansions"] == again["expansions"]
    assert_pools_full(loop)


def test_bad_arguments_are_refused(loop):
    cases = {(): "the following arguments are required: QUESTION",
             ("q", "--points", "0"): "argument --points: expected a whole number >= 1, not '0'",
             ("q", "--skeleton", "|"): "argument --skeleton: must name a point",
             ("q", "--max-tokens"): "argument --max-tokens: expected one argument",
             ("q", "--depth", "2"): "unrecognized arguments: --depth 2",
             ("q", "r"): "unrecognized arguments: r"}
    for stderr, error in zip(refused(loop, "skeleton-of-thought", [list(args) for args in cases]), cases.values()):
        assert stderr.startswith("usage: skeleton-of-thought [-h]")
        assert stderr.endswith(f"skeleton-of-thought: error: {error}\n")
