"""inferlets/beam-search against beam search and exhaustive search computed on the host.

The reference runs every sequence through the inference process from scratch (one batched
forward per step, no KV cache), so it shares nothing with the inferlet but the model.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from harness import NUM_PAGES, assert_pools_full, messages, refused
from oven.control.tokenizer import Tokenizer
from oven.proto import inference as p

PROMPT = ("Beam search keeps the few most probable continuations of a prompt at every step; this prompt "
          "is long enough to fill two pages of sixteen tokens and part of a third one, here")
TOLERANCE = 1e-5  # on summed log-probabilities


PROGRAMS = ["beam-search"]  # stored in the module's ControlLoop (the `loop` fixture, conftest.py)


def host_dists(inference, page_size: int, sequences: list[list[int]], top_k: int) -> list[list[tuple[int, float]]]:
    """The top-k (token, prob) after each whole sequence, all forwarded in one batch on disjoint pages."""
    pages_each = -(-max(map(len, sequences)) // page_size)
    assert pages_each * len(sequences) <= NUM_PAGES
    items = []
    for i, seq in enumerate(sequences):
        pages = list(range(i * pages_each, i * pages_each + -(-len(seq) // page_size)))
        items.append(p.ForwardTextItem(seq, list(range(len(seq))), pages, len(seq) - (len(pages) - 1) * page_size,
                                       [len(seq) - 1], top_k))
    with inference.client() as client:
        reply = client.call(p.ForwardTextRequest(items))
    assert reply.errors == [None] * len(items)
    return [list(zip(np.frombuffer(d.token_ids, "<i4").tolist(), np.frombuffer(d.probs, "<f4").tolist()))
            for (d,) in reply.dists]


def reference_beams(dists, prompt: list[int], width: int, length: int, expand: int) -> list[tuple[float, list[int]]]:
    """The inferlet's algorithm, tie-breaking included, on host distributions."""
    beams = [(0.0, [])]
    for _ in range(length):
        candidates = [(score + math.log(prob), b, rank, token)
                      for b, ((score, _), dist) in enumerate(zip(beams, dists([prompt + t for _, t in beams], expand)))
                      for rank, (token, prob) in enumerate(dist)]
        beams = [(score, beams[b][1] + [token])
                 for score, b, _, token in sorted(candidates, key=lambda c: (-c[0], c[1], c[2]))[:width]]
    return beams


def exhaustive(dists, prompt: list[int], expand: int, length: int) -> list[tuple[float, list[int]]]:
    """Every sequence whose each token is among the top ``expand`` after its prefix, best first."""
    level = [(0.0, [])]
    for _ in range(length):
        level = [(score + math.log(prob), tokens + [token])
                 for (score, tokens), dist in zip(level, dists([prompt + t for _, t in level], expand))
                 for token, prob in dist]
    return sorted(level, key=lambda leaf: -leaf[0])


def run_counting_pages(loop, args: list[str]):
    """Run one instance to the end; return it and the most KvPages in use at once."""
    inst, peak = loop.launch("beam-search", args), [0]

    def done() -> bool:
        peak[0] = max(peak[0], NUM_PAGES - loop.replicas[0].kv_pool.num_free)
        return not inst.alive
    assert loop.run_until(done, 120)
    assert inst.exit_code == 0, inst.error
    (message,) = messages(loop, inst)
    return [(beam["score"], beam["tokens"]) for beam in json.loads(message)], peak[0]


def assert_same_beams(got, want) -> None:
    assert [tokens for _, tokens in got] == [tokens for _, tokens in want]
    assert np.allclose([s for s, _ in got], [s for s, _ in want], rtol=0, atol=TOLERANCE)


@pytest.fixture(scope="module")
def setting(loop, inference):
    tok = Tokenizer(loop.info.tokenizer)
    prompt = tok.encode(PROMPT)
    assert len(prompt) > 2 * loop.info.page_size
    return prompt, lambda seqs, k: host_dists(inference, loop.info.page_size, seqs, k)


def test_beams_equal_host_beam_search_and_share_the_prompt_pages(loop, setting):
    prompt, dists = setting
    width, length = 3, 5
    got, peak_pages = run_counting_pages(loop, [PROMPT, str(width), str(length)])
    assert_same_beams(got, reference_beams(dists, prompt, width, length, width))
    assert [s for s, _ in got] == sorted((s for s, _ in got), reverse=True)
    # Shared full pages: the prompt's are held once, not once per beam.
    beam_pages = -(-(len(prompt) + length) // loop.info.page_size)
    assert peak_pages < width * beam_pages
    assert_pools_full(loop)


def test_wide_enough_beam_is_exhaustive_over_the_top_k_tree(loop, setting):
    prompt, dists = setting
    expand, length = 3, 3
    width = expand ** (length - 1)  # keeps every node above the leaves: exact
    got, _ = run_counting_pages(loop, [PROMPT, str(width), str(length), "--expand", str(expand)])
    leaves = exhaustive(dists, prompt, expand, length)
    assert len(leaves) == expand ** length
    assert_same_beams(got, leaves[:width])  # the best beam is the exhaustive optimum, and so on down
    assert_pools_full(loop)


@pytest.mark.parametrize("args, error", [
    (["p", "0", "3"], "argument WIDTH: expected a whole number >= 1, not '0'"),
    (["p", "2"], "the following arguments are required: LENGTH"),
    (["p", "2", "3", "--wide", "2"], "unrecognized arguments: --wide 2"),
    (["p", "x", "3"], "argument WIDTH: expected a whole number >= 1, not 'x'"),
])
def test_bad_arguments_fail_with_usage(loop, args, error):
    (stderr,) = refused(loop, "beam-search", [args])
    assert stderr.startswith("usage: beam-search [-h] [--expand K] PROMPT WIDTH LENGTH")
    assert stderr.endswith(f"beam-search: error: {error}\n")
