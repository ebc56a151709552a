"""inferlets/best-of-n against a ranking recomputed on the host.

The host scores every candidate the inferlet sampled again, from scratch: transformers' Llama on the
tiny model's very weights gives each token's log-probability after the prompt and the tokens before
it (no KV cache, no server), the G-gram overlaps are counted here, and the greedy ranking by quality
minus L x overlap is redone. The inferlet's ranking must be that ranking, index for index; only the
scores get a float tolerance.
"""

from __future__ import annotations

import json

import pytest
import torch
from conftest import hf_reference, make_engine
from harness import assert_pools_full, control_loop, messages, refused, run, tiny_inference
from oven.control.tokenizer import Tokenizer

PROMPT = "Once upon a time, in a land far away"
TOLERANCE = 1e-5  # on a mean log-probability (float32 logits in the server and here)
PROGRAMS = ["best-of-n"]


@pytest.fixture(scope="module")
def hf():
    return hf_reference(make_engine("tiny"))  # the inference process's tiny model: the same seed, the same weights


def host_quality(hf, prompt: list[int], tokens: list[int]) -> float:
    with torch.no_grad():
        logprobs = torch.log_softmax(hf(torch.tensor([prompt + tokens])).logits[0].double(), dim=-1)
    return sum(logprobs[len(prompt) - 1 + j, t].item() for j, t in enumerate(tokens)) / len(tokens)


def host_overlap(tokens: list[int], above: list[list[int]], size: int) -> float:
    def grams(x):
        return {tuple(x[i:i + size]) for i in range(len(x) - size + 1)}
    own = grams(tokens)
    return max((len(own & grams(a)) / len(own) for a in above), default=0.0) if own else 0.0


def host_ranking(quality: dict[int, float], tokens: dict[int, list[int]], size: int, weight: float):
    """[(index, overlap, score)], best first: each next, the highest score; on a tie (within the
    tolerance: the host cannot tell them apart) the lower index."""
    left, ranked = sorted(quality), []
    while left:
        scores = {i: (quality[i] - weight * host_overlap(tokens[i], [tokens[r] for r, _, _ in ranked], size), i)
                  for i in left}
        top = max(s for s, _ in scores.values())
        contenders = [i for i in left if scores[i][0] >= top - 2 * TOLERANCE]
        chosen = contenders[0]
        if len(contenders) > 1:
            pytest.fail(f"candidates {contenders} score within float noise of each other: choose other arguments")
        ranked.append((chosen, host_overlap(tokens[chosen], [tokens[r] for r, _, _ in ranked], size),
                       scores[chosen][0]))
        left.remove(chosen)
    return ranked


def rerank_on_host(hf, prompt: list[int], report: dict, size: int, weight: float) -> None:
    ranking = report["ranking"]
    assert report["best"] == ranking[0]
    tokens = {c["index"]: c["tokens"] for c in ranking}
    quality = {i: host_quality(hf, prompt, t) for i, t in tokens.items()}
    for c in ranking:
        assert abs(c["quality"] - quality[c["index"]]) < TOLERANCE, c
    want = host_ranking(quality, tokens, size, weight)
    assert [c["index"] for c in ranking] == [i for i, _, _ in want]  # the choice: exact
    assert [c["overlap"] for c in ranking] == pytest.approx([o for _, o, _ in want], abs=1e-12)
    assert [c["score"] for c in ranking] == pytest.approx([s for _, _, s in want], abs=TOLERANCE)


def reports(loop, args_list):
    instances = run(loop, "best-of-n", args_list)
    assert [i.exit_code for i in instances] == [0] * len(instances), [i.error for i in instances]
    return [json.loads(m) for i in instances for m in messages(loop, i)]


def test_the_ranking_is_the_hosts_rescoring(loop, hf):
    prompt = Tokenizer(loop.info.tokenizer).encode(PROMPT)
    base = [PROMPT, "--n", "6", "--max-tokens", "6", "--top-p", "0.0005"]
    cases = [(["--ngram", "1", "--seed", "5"], 1, 1.0),    # overlaps reorder the candidates
             (["--ngram", "2", "--seed", "0"], 2, 1.0),    # no shared bigram: by quality alone
             (["--ngram", "1", "--seed", "5", "--diversity", "0"], 1, 0.0),
             (["--ngram", "1", "--seed", "5", "--diversity", "0.05"], 1, 0.05)]
    results = reports(loop, [base + args for args, _, _ in cases] + [base + cases[0][0]])
    for report, (_, size, weight) in zip(results, cases):
        assert len(report["ranking"]) == 6 and sorted(c["index"] for c in report["ranking"]) == list(range(6))
        rerank_on_host(hf, prompt, report, size, weight)
    diverse, _, by_quality, _ = (r["ranking"] for r in results[:4])
    assert [c["tokens"] for c in sorted(diverse, key=lambda c: c["index"])] == \
        [c["tokens"] for c in sorted(by_quality, key=lambda c: c["index"])]  # the same candidates ...
    assert [c["index"] for c in diverse] != [c["index"] for c in by_quality]  # ... ranked otherwise
    assert any(c["overlap"] > 0 for c in diverse)
    # seeded per candidate: the same candidates and ranking whatever ran beside it (the log-probabilities
    # may differ in their last bits: a batch of other shapes sums in another order)
    again, first = results[4]["ranking"], results[0]["ranking"]
    assert [(c["index"], c["tokens"], c["text"], c["overlap"]) for c in again] == \
        [(c["index"], c["tokens"], c["text"], c["overlap"]) for c in first]
    assert [c["score"] for c in again] == pytest.approx([c["score"] for c in first], abs=TOLERANCE)
    assert_pools_full(loop)


def test_identical_candidates_rank_in_index_order_with_full_overlap(loop, hf):
    prompt = Tokenizer(loop.info.tokenizer).encode(PROMPT)
    (report,) = reports(loop, [[PROMPT, "--n", "3", "--max-tokens", "5", "--temperature", "0", "--diversity", "0.5"]])
    ranking = report["ranking"]
    assert len({tuple(c["tokens"]) for c in ranking}) == 1  # temperature 0: greedy, three times
    assert [c["index"] for c in ranking] == [0, 1, 2] and [c["overlap"] for c in ranking] == [0.0, 1.0, 1.0]
    quality = host_quality(hf, prompt, ranking[0]["tokens"])
    assert [c["score"] for c in ranking] == pytest.approx([quality, quality - 0.5, quality - 0.5], abs=TOLERANCE)


@pytest.mark.parametrize("args, error", [
    ([], "the following arguments are required: PROMPT"),
    (["p", "--n", "0"], "argument --n: expected a whole number from 1 to 64, not '0'"),
    (["p", "--n", "65"], "argument --n: expected a whole number from 1 to 64, not '65'"),
    (["p", "--top-p", "1.5"], "argument --top-p: expected a number > 0 and <= 1, not '1.5'"),
    (["p", "--temperature"], "argument --temperature: expected one argument"),
    (["p", "--beam", "2"], "unrecognized arguments: --beam 2"),
    (["p", "--seed", "x"], "argument --seed: expected a whole number >= 0, not 'x'"),
])
def test_bad_arguments_are_refused(loop, args, error):
    (stderr,) = refused(loop, "best-of-n", [args])
    assert stderr.startswith("usage: best-of-n [-h] [--n N] [--max-tokens M]")
    assert stderr.endswith(f"best-of-n: error: {error}\n")
    assert_pools_full(loop)


def test_64_long_candidates_are_ranked_within_their_slices():
    """64 candidates of 64 tokens (their seeds draw no end token): the ranking that made the G-grams of
    every candidate again for each pair (N³ sets) ran past a 1000 ms slice and was stopped; it now makes
    them once and yields each round."""
    with tiny_inference(num_kv_pages=1024) as process, \
            control_loop(process, None, PROGRAMS, max_kv_pages_per_instance=1024) as tiny:
        (inst,) = run(tiny, "best-of-n", [[PROMPT, "--n", "64", "--max-tokens", "64"]], timeout_s=300)
        assert (inst.exit_code, inst.error) == (0, None)
        (report,) = [json.loads(m) for m in messages(tiny, inst)]
    ranking = report["ranking"]
    assert sorted(c["index"] for c in ranking) == list(range(64)) and {len(c["tokens"]) for c in ranking} == {64}
    # each next is the best score left: scores never rise down the ranking, and equal ones go by index
    assert all((a["score"], -a["index"]) > (b["score"], -b["index"]) for a, b in zip(ranking, ranking[1:]))
