"""inferlets/self-consistency against seeded sampling alone and a majority vote counted here, on SmolLM2.

Every path is a fork of one prompt context whose forwards batch with the other paths'; the reference
samples path i alone, step by step from a fresh prefill straight from the inference process, with the
SDK's own seeded sampler (top-K at temperature T, seed S + i) drawing from each returned distribution.
The paths must be those tokens exactly. The answers are then extracted and counted here: the majority
answer, its votes and the whole tally (ties in the order the answers first appear) must be the
inferlet's, and so must the consensus path (Pie's consensus decoding): each path's mean normalized
edit-distance similarity to the others, recomputed here with a full edit-distance table.
"""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest
from harness import NUM_PAGES, assert_pools_full, control_loop, messages, refused, run, tiny_inference

from oven.client.generate import PagedSequence
from oven.control.tokenizer import Tokenizer
from oven.inference.sampling import sdk
from oven.proto import inference as p

MODEL = "smollm2-135m-instruct"  # a real model: its paths reach answers, and some disagree
INFERENCE_MODEL = MODEL
PROGRAMS = ["self-consistency"]
PROMPT = "Question: Tom has 3 boxes of 4 apples and eats 2. How many apples are left?\nAnswer:"
N, MAX_TOKENS, TOP_K, TEMPERATURE = 6, 12, 20, 1.2


def consistency(loop, *args: str) -> dict:
    (inst,) = run(loop, "self-consistency", [[PROMPT, "--n", str(N), "--max-tokens", str(MAX_TOKENS), "--top-k",
                                              str(TOP_K), "--temperature", str(TEMPERATURE), *args]])
    assert inst.exit_code == 0, inst.error
    (message,) = messages(loop, inst)
    return json.loads(message)


def sampled_alone(inference, loop, prompt: list[int], seed: int) -> list[int]:
    """Path ``seed``'s tokens: a fresh prefill, then one step at a time, the SDK's sampler drawing each
    token from the distribution the inference process returns (nothing else may run meanwhile)."""
    sampler, stop = sdk.TopK(TOP_K, TEMPERATURE, seed), Tokenizer(loop.info.tokenizer).stop_token_ids
    seq, inputs, out = PagedSequence(loop.info.page_size, list(range(NUM_PAGES))), prompt, []
    with inference.client() as client:
        while len(out) < MAX_TOKENS and not (out and out[-1] in stop):
            pages, last_page_len = seq.extend(len(inputs))
            positions = list(range(seq.num_tokens - len(inputs), seq.num_tokens))
            reply = client.call(p.ForwardTextRequest([p.ForwardTextItem(
                inputs, positions, pages, last_page_len, [len(inputs) - 1], sampler.top_k)]))
            assert reply.errors == [None]
            dist = reply.dists[0][0]
            ids, probs = list(memoryview(dist.token_ids).cast("i")), list(memoryview(dist.probs).cast("f"))
            out.append(sampler.sample(ids, probs))
            inputs = [out[-1]]
    return out


def host_tally(answers: list[str | None]) -> list[list]:
    """Most votes first; on equal votes, the answer some path gave first."""
    counts = Counter(a for a in answers if a is not None)
    first = {a: answers.index(a) for a in counts}
    return [[a, counts[a]] for a in sorted(counts, key=lambda a: (-counts[a], first[a]))]


def edit_distance(a: str, b: str) -> int:
    table = [[i + j if i * j == 0 else 0 for j in range(len(b) + 1)] for i in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            table[i][j] = min(table[i - 1][j] + 1, table[i][j - 1] + 1, table[i - 1][j - 1] + (a[i - 1] != b[j - 1]))
    return table[-1][-1]


def host_centrality(paths: list[dict]) -> list[float]:
    """Each path's mean similarity to the others: its answer, or its stripped text, first 64 characters."""
    keys = [(q["answer"] if q["answer"] is not None else q["text"].strip())[:64] for q in paths]
    sim = lambda a, b: 1.0 - edit_distance(a, b) / max(len(a), len(b)) if a or b else 1.0  # noqa: E731
    return [sum(sim(a, b) for j, b in enumerate(keys) if j != i) / (len(keys) - 1) for i, a in enumerate(keys)]


def last_match(pattern: str, text: str) -> str | None:
    matches = list(re.finditer(pattern, text))
    if not matches:
        return None
    return matches[-1].group(1) if re.compile(pattern).groups else matches[-1].group(0)


@pytest.fixture(scope="module")
def report(loop):
    return consistency(loop, "--seed", "3")


def test_each_path_is_its_seeded_sampler_alone_and_the_vote_is_the_hosts(loop, inference, report):
    tok = Tokenizer(loop.info.tokenizer)
    prompt = tok.encode(PROMPT)
    assert [q["index"] for q in report["paths"]] == list(range(N))
    for path in report["paths"]:
        assert path["tokens"] == sampled_alone(inference, loop, prompt, 3 + path["index"]), path
        assert path["text"] == tok.decode([t for t in path["tokens"] if t not in tok.stop_token_ids])
        assert path["answer"] == last_match(r"-?\d+(?:\.\d+)?", path["text"])
    want = host_tally([q["answer"] for q in report["paths"]])
    assert report["counts"] == want
    assert (report["answer"], report["votes"]) == tuple(want[0])
    scores = host_centrality(report["paths"])
    assert report["central"] == {"index": scores.index(max(scores)), "centrality": scores}
    assert len(set(scores)) > 1  # the paths differ: a real ranking
    assert len(want) > 1 and len({tuple(q["tokens"]) for q in report["paths"]}) == N  # a real vote
    assert_pools_full(loop)


def test_a_pattern_group_and_ties_go_to_the_first_answer_given(loop, report):
    # the first word of each path as its answer: the paths' words, counted with ties in first-seen order
    words = consistency(loop, "--seed", "3", "--pattern", r"^\s*(\w+)")
    assert [q["tokens"] for q in words["paths"]] == [q["tokens"] for q in report["paths"]]  # seeded: the same paths
    answers = [last_match(r"^\s*(\w+)", q["text"]) for q in words["paths"]]
    assert [q["answer"] for q in words["paths"]] == answers
    assert words["counts"] == host_tally(answers) and words["answer"] == host_tally(answers)[0][0]
    assert [n for _, n in words["counts"]].count(1) >= 2  # answers tied on one vote: ordered by the tie rule
    # a pattern no path matches: no answer, no votes
    none = consistency(loop, "--seed", "3", "--pattern", "no path writes this")
    assert (none["answer"], none["votes"], none["counts"]) == (None, 0, [])
    assert all(q["answer"] is None for q in none["paths"])
    scores = host_centrality(none["paths"])  # no answers: the paths' texts are compared
    assert none["central"] == {"index": scores.index(max(scores)), "centrality": scores}


def test_the_consensus_of_64_long_paths_keeps_within_its_slices():
    """64 paths whose keys are 64-character texts: about 8 million edit-distance steps, more than one
    1000 ms slice holds; the inferlet computes a row per slice, so it is not stopped (it was, before)."""
    with tiny_inference() as process, control_loop(process, None, PROGRAMS, max_kv_pages_per_instance=NUM_PAGES) as tiny:
        (inst,) = run(tiny, "self-consistency", [["Once upon a time", "--n", "64", "--max-tokens", "24",
                                                  "--pattern", "no path writes this"]], timeout_s=300)
        assert (inst.exit_code, inst.error) == (0, None)
        report = json.loads(messages(tiny, inst)[0])
    assert min(len(q["text"].strip()) for q in report["paths"]) >= 64  # every key is a full 64 characters
    scores = report["central"]["centrality"]
    assert len(scores) == 64 and report["central"]["index"] == scores.index(max(scores))


@pytest.mark.parametrize("args, error", [
    ([], "the following arguments are required: PROMPT"),
    (["q", "--n", "0"], "argument --n: expected a whole number from 1 to 64, not '0'"),
    (["q", "--n", "65"], "argument --n: expected a whole number from 1 to 64, not '65'"),
    (["q", "--temperature", "-1"], "argument --temperature: expected a number >= 0, not '-1'"),
    (["q", "--pattern", "("], "argument --pattern: not a regular expression: missing ), unterminated subpattern at position 0"),
    (["q", "--pattern", "a" * 257], "argument --pattern: longer than 256 characters"),
    (["q", "--seed"], "argument --seed: expected one argument"),
    (["q", "--votes", "1"], "unrecognized arguments: --votes 1"),
])
def test_bad_arguments_are_refused(loop, args, error):
    (stderr,) = refused(loop, "self-consistency", [args])
    assert stderr.startswith("usage: self-consistency [-h] [--n N] [--max-tokens M]")
    assert stderr.endswith(f"self-consistency: error: {error}\n")
