"""inferlets/parallel-generation: forked branches decode as if alone, and their forwards batch together."""

from __future__ import annotations

import json

from harness import (
    assert_pools_full,
    direct_greedy,
    messages,
    refused,
    run,
)
from oven.control.tokenizer import Tokenizer

PROMPT = "A shared prompt that is long enough to fill one page and then some more words:"
SUFFIXES = [" first", " the second branch", "", " 4"]
MAX_NEW = 6


PROGRAMS = ["parallel-generation"]  # stored in the module's ControlLoop (the `loop` fixture, conftest.py)


def record_batches(loop) -> list:
    """(call type, number of commands, number of queues) of every batch the scheduler forms from now on."""
    batches, form = [], loop.replicas[0].scheduler.form_batch

    def recording(*args):
        batch = form(*args)
        if batch is not None:
            batches.append((batch.call_type, len(batch.commands), len({c.queue_id for c in batch.commands})))
        return batch
    loop.replicas[0].scheduler.form_batch = recording
    return batches


def test_branches_equal_solo_generation_and_batch_horizontally(loop, inference):
    tok = Tokenizer(loop.info.tokenizer)
    prompt_ids = tok.encode(PROMPT)
    assert len(prompt_ids) > loop.info.page_size and len(prompt_ids) % loop.info.page_size  # a partial page to copy
    before, batches = loop.replicas[0].scheduler.stats(), record_batches(loop)
    (inst,) = run(loop, "parallel-generation", [[PROMPT, str(MAX_NEW), *SUFFIXES]])
    assert inst.exit_code == 0, inst.error
    after = loop.replicas[0].scheduler.stats()
    (message,) = messages(loop, inst)
    results = json.loads(message)
    assert [r["suffix"] for r in results] == SUFFIXES
    for result, suffix in zip(results, SUFFIXES):
        # The inferlet tokenizes prompt and suffix apart: the reference does too.
        assert result["tokens"] == direct_greedy(inference, loop, prompt_ids + tok.encode(suffix), MAX_NEW)
    forwards = [(n, q) for call, n, q in batches if call == "forward_text"]
    assert forwards[0] == (1, 1)  # the prompt, once
    # Every decode step of the branches is one batch with one item per branch, each on its own queue.
    assert forwards[1:] == [(len(SUFFIXES), len(SUFFIXES))] * MAX_NEW
    assert after.num_horizontal_batches - before.num_horizontal_batches >= MAX_NEW
    assert_pools_full(loop)


def test_bad_arguments_fail_with_usage(loop):
    errors = ["argument MAX_NEW_TOKENS: expected a whole number >= 1, not 'many'", "the prompt is empty"]
    for stderr, error in zip(refused(loop, "parallel-generation", [["prompt", "many", "x"], ["", "2", "x"]]), errors):
        assert stderr.startswith("usage: parallel-generation [-h] PROMPT MAX_NEW_TOKENS SUFFIX [SUFFIX ...]")
        assert stderr.endswith(f"parallel-generation: error: {error}\n")
    assert_pools_full(loop)
