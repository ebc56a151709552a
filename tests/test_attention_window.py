"""inferlets/attention-window: sink + sliding window via mask-kvpage equals transformers with that 4D mask."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import hf_reference, make_engine
from harness import assert_pools_full, messages, refused, run
from oven.control.tokenizer import Tokenizer
from oven.proto import inference as p

PROMPT = "An attention sink keeps the first few tokens visible while a window slides over the rest of the text"
MAX_NEW, TOP_K = 16, 8
RTOL = 1e-4  # the tiny model's probabilities are all near 1/vocab: compare them relatively


PROGRAMS = ["attention-window"]  # stored in the module's ControlLoop (the `loop` fixture, conftest.py)


@pytest.fixture(scope="module")
def hf():
    return hf_reference(make_engine("tiny"))  # random weights from a fixed seed: the server's too (checked below)


def window_mask(num_tokens: int, num_prompt: int, sink: int, window: int) -> torch.Tensor:
    """bool [T, T], True = may attend: causal for the prompt but its last token, sink + window after."""
    q, k = torch.arange(num_tokens)[:, None], torch.arange(num_tokens)[None, :]
    return (k <= q) & ((q < num_prompt - 1) | (k < sink) | (k >= q + 1 - window))


def hf_probs(hf, tokens: list[int], mask: torch.Tensor | None) -> np.ndarray:
    with torch.no_grad():
        logits = hf(torch.tensor([tokens]), attention_mask=None if mask is None else mask[None, None]).logits[0]
    return torch.softmax(logits.double(), -1).numpy()


def test_the_server_holds_the_in_process_weights(loop, inference, hf):
    prompt, page_size = Tokenizer(loop.info.tokenizer).encode(PROMPT), loop.info.page_size
    assert page_size < len(prompt) <= 2 * page_size
    item = p.ForwardTextItem(prompt, list(range(len(prompt))), [0, 1], len(prompt) - page_size, [len(prompt) - 1], TOP_K)
    with inference.client() as client:
        (dist,) = client.call(p.ForwardTextRequest([item])).dists[0]
    ids, probs = np.frombuffer(dist.token_ids, "<i4"), np.frombuffer(dist.probs, "<f4")
    want = hf_probs(hf, prompt, None)[-1]
    assert ids.tolist() == np.argsort(-want)[:TOP_K].tolist()
    np.testing.assert_allclose(probs, want[ids], rtol=RTOL)


@pytest.mark.parametrize("sink,window", [(4, 6), (0, 3), (2, 64)])
def test_each_step_equals_transformers_with_the_window_mask(loop, hf, sink, window):
    prompt = Tokenizer(loop.info.tokenizer).encode(PROMPT)
    (inst,) = run(loop, "attention-window", [[PROMPT, str(sink), str(window), str(MAX_NEW), str(TOP_K)]])
    assert inst.exit_code == 0, inst.error
    steps = [json.loads(m) for m in messages(loop, inst)]
    assert len(steps) == MAX_NEW
    tokens = prompt + [step["token_ids"][0] for step in steps[:-1]]  # greedy: each step feeds its top token
    mask = window_mask(len(tokens), len(prompt), sink, window)
    want = hf_probs(hf, tokens, mask)[len(prompt) - 1:]
    full = hf_probs(hf, tokens, None)[len(prompt) - 1:]
    for step, row, causal in zip(steps, want, full):
        assert step["token_ids"] == np.argsort(-row)[:TOP_K].tolist()
        np.testing.assert_allclose(step["probs"], row[step["token_ids"]], rtol=RTOL)
    hides = len(tokens) > sink + window
    # The window matters exactly when it hides something: then full attention is far off.
    assert (np.abs(want / full - 1).max() > 100 * RTOL) == hides
    assert_pools_full(loop)


@pytest.mark.parametrize("args, error", [
    (["p", "4", "0", "8"], "argument WINDOW: expected a whole number >= 1, not '0'"),
    (["p", "4", "6"], "the following arguments are required: MAX_NEW_TOKENS"),
    (["p", "a", "6", "8"], "argument SINK: expected a whole number >= 0, not 'a'"),
    (["", "1", "1", "1"], "the prompt is empty"),
])
def test_bad_arguments_fail_clearly(loop, args, error):
    (stderr,) = refused(loop, "attention-window", [args])
    assert stderr.startswith("usage: attention-window [-h] PROMPT SINK WINDOW MAX_NEW_TOKENS [TOP_K]")
    assert stderr.endswith(f"attention-window: error: {error}\n")
