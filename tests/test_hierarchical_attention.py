"""inferlets/hierarchical-attention: block-diagonal sections by page masks equal transformers with that
explicit 4D mask, and differ from full attention (which the --full run equals)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import hf_reference, make_engine
from harness import assert_pools_full, messages, refused, run
from oven.control.tokenizer import Tokenizer

HEADER = "Notes from the garden club meeting."
SECTIONS = ["Tomatoes need full sun and deep watering twice a week.",
            "The spring fair moves to the second Saturday of May this year.",
            "Dues rise to twelve dollars starting in the autumn."]
QUERY = "Summary of all sections:"
MAX_NEW, TOP_K = 6, 8
RTOL = 1e-4  # the tiny model's probabilities are all near 1/vocab: compare them relatively
PROGRAMS = ["hierarchical-attention"]  # stored in the module's ControlLoop (the `loop` fixture, conftest.py)


@pytest.fixture(scope="module")
def hf():
    return hf_reference(make_engine("tiny"))  # random weights from a fixed seed: the server's too


def block_mask(header: list[int], sections: list[list[int]], num_tokens: int) -> torch.Tensor:
    """bool [T, T], True = may attend: causal; a section's token sees the header and its own section; the
    query and what follows it see everything."""
    owner = torch.full((num_tokens,), -1)  # -1: the header; i: section i; len(sections): the query and after
    at = len(header)
    for i, section in enumerate(sections):
        owner[at:at + len(section)] = i
        at += len(section)
    owner[at:] = len(sections)
    q, k = torch.arange(num_tokens)[:, None], torch.arange(num_tokens)[None, :]
    return (k <= q) & ((owner[k] == -1) | (owner[q] == owner[k]) | (owner[q] == len(sections)))


def hf_probs(hf, tokens: list[int], mask: torch.Tensor | None) -> np.ndarray:
    with torch.no_grad():
        logits = hf(torch.tensor([tokens]), attention_mask=None if mask is None else mask[None, None]).logits[0]
    return torch.softmax(logits.double(), -1).numpy()


def generate(loop, *extra: str) -> dict:
    args = [HEADER, *SECTIONS, "--query", QUERY, "--max-tokens", str(MAX_NEW), "--top-k", str(TOP_K), *extra]
    (inst,) = run(loop, "hierarchical-attention", [args])
    assert inst.exit_code == 0, inst.error
    (message,) = messages(loop, inst)
    return json.loads(message)


def assert_steps_equal(report: dict, want: np.ndarray) -> None:
    for step, row in zip(report["steps"], want, strict=True):
        assert step["token_ids"] == np.argsort(-row)[:TOP_K].tolist()
        np.testing.assert_allclose(step["probs"], row[step["token_ids"]], rtol=RTOL)


@pytest.fixture(scope="module")
def reports(loop):
    return generate(loop), generate(loop, "--full")


def test_the_sections_pieces_are_encoded_on_their_own(loop, reports):
    tok = Tokenizer(loop.info.tokenizer)
    for report in reports:
        assert report["header"] == tok.encode(HEADER) and report["query"] == tok.encode(QUERY)
        assert report["sections"] == [tok.encode(s) for s in SECTIONS]
        assert report["tokens"] == [s["token_ids"][0] for s in report["steps"]] and len(report["tokens"]) == MAX_NEW
        assert report["text"] == tok.decode(report["tokens"])


def test_each_step_equals_transformers_with_the_block_mask_and_not_full_attention(loop, hf, reports):
    masked, full = reports
    prompt = masked["header"] + sum(masked["sections"], []) + masked["query"]
    tokens = prompt + masked["tokens"][:-1]  # greedy: each step feeds its top token
    want = hf_probs(hf, tokens, block_mask(masked["header"], masked["sections"], len(tokens)))[len(prompt) - 1:]
    assert_steps_equal(masked, want)
    causal = hf_probs(hf, tokens, None)[len(prompt) - 1:]
    # the masks are real: full attention over the same tokens is far off from the first step on
    assert np.abs(want[0] / causal[0] - 1).max() > 100 * RTOL
    full_tokens = prompt + full["tokens"][:-1]
    assert_steps_equal(full, hf_probs(hf, full_tokens, None)[len(prompt) - 1:])
    assert_pools_full(loop)


@pytest.mark.parametrize("args, error", [
    (["h", "a", "--query", "q"], "give two or more SECTIONs"),
    (["h", "a", "b"], "the following arguments are required: --query"),
    (["h", "a", " ", "--query", "q"], "argument SECTION: must not be empty"),
    (["h", "a", "b", "--query", ""], "argument --query: must not be empty"),
    (["h", "a", "b", "--query", "q", "--top-k", "0"], "argument --top-k: expected a whole number >= 1, not '0'"),
    (["h", "a", "b", "--query"], "argument --query: expected one argument"),
    (["h", "a", "b", "--query", "q", "--window", "2"], "unrecognized arguments: --window"),  # "2" is a SECTION
])
def test_bad_arguments_are_refused(loop, args, error):
    (stderr,) = refused(loop, "hierarchical-attention", [args])
    assert stderr.startswith("usage: hierarchical-attention [-h] --query QUERY [--max-tokens M]")
    assert stderr.endswith(f"hierarchical-attention: error: {error}\n")
