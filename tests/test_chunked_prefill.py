"""Chunked prefill (control/scheduling/chunks.py): a forward of more than ``prefill_chunk_tokens`` inputs
goes to the inference process as chunks, batches hold at most two chunks' worth, and decode steps join
every batch ahead of other prompts' chunks. The chunks' pieces are checked exactly; through a real
inference process (tiny model), every forward call of the raw API and the SDK's pipelined decode give
the tokens of direct greedy decoding, and no batch sent is larger than the budget."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from harness import assert_pools_full, direct_greedy, messages, run

from oven.control.runtime.calls import InferenceCalls
from oven.control.runtime.futures import DISTS, FutureTable
from oven.control.runtime.instance import State
from oven.control.tokenizer import Tokenizer
from oven.control.scheduling.batcher import BatchScheduler
from oven.control.scheduling.chunks import AUTO, chunk_budget, split_forward
from oven.control.scheduling.commands import Command
from oven.control.scheduling.footprint import Embed, TokenSlot
from oven.proto import inference as p

CHUNK = 32
LOOP_CONFIG = {"prefill_chunk_tokens": CHUNK}
PROGRAMS = ["hello-python", "text-completion", "conformance"]
PROMPT = " ".join(f"Item {i} is a {['red', 'green', 'blue'][i % 3]} box on shelf {i % 7}." for i in range(24))


def test_chunks_cut_the_context_the_mask_and_the_outputs():
    """40 inputs after 5 tokens already in the context, chunks of 16: each chunk's context ends after its
    last input, its mask rows are cut to that context, its outputs are renumbered, and the sample goes
    with the last output; input futures are read by the chunk that feeds them."""
    pages, page_size = [7, 3, 9], 16  # 45 tokens: the last page holds 13
    mask = [bytes([0xFF] * 6) for _ in range(40)]  # 45 bits each
    futures = [-1] * 39 + [11]
    item = p.ForwardTextItem(list(range(100, 140)), list(range(5, 45)), pages, 13, [39, 3, 20], 5,
                             attention_mask=mask, adapter_id=2, token_futures=futures,
                             sample=p.SampleSpec(12, p.SAMPLE_GREEDY))
    chunks = split_forward(item, page_size, 16)
    assert [c.num_tokens for c in chunks] == [16, 16, 8]
    assert [(c.item.kv_page_ids, c.item.kv_last_page_len) for c in chunks] == [
        ([7, 3], 5), ([7, 3, 9], 5), ([7, 3, 9], 13)]  # contexts of 21, 37 and 45 tokens
    assert [c.kv_context for c in chunks] == [([7, 3], 5, 16, 16), ([7, 3, 9], 5, 16, 16), (pages, 13, 8, 16)]
    assert [c.item.token_ids for c in chunks] == [list(range(100, 116)), list(range(116, 132)),
                                                  list(range(132, 140))]
    assert [c.item.positions[0] for c in chunks] == [5, 21, 37]
    assert [c.item.attention_mask for c in chunks] == [[bytes([0xFF] * 3)] * 16, [bytes([0xFF] * 5)] * 16,
                                                       [bytes([0xFF] * 6)] * 8]
    assert [(c.item.output_indices, c.outputs) for c in chunks] == [([3], [1]), ([4], [2]), ([7], [0])]
    assert [c.item.sample for c in chunks] == [None, item.sample, None]  # the last output is index 20
    assert [c.item.token_futures for c in chunks] == [None, None, [-1] * 7 + [11]]
    assert [(c.reads, c.writes) for c in chunks] == [
        (frozenset(), frozenset()), (frozenset(), frozenset({TokenSlot(12)})),
        (frozenset({TokenSlot(11)}), frozenset())]
    assert {(c.item.top_k, c.item.adapter_id) for c in chunks} == {(5, 2)}


def test_a_malformed_forward_is_not_split():
    """Sent whole, it fails with the inference process's words for the fault, not a chunk's."""
    good = p.ForwardTextItem(list(range(40)), list(range(40)), [1, 2, 3], 8, [39])
    assert len(split_forward(good, 16, 16)) == 3
    for bad in [dict(output_indices=[40]), dict(output_indices=[-1]), dict(kv_last_page_len=17),
                dict(kv_page_ids=[1, 2]), dict(attention_mask=[b"\xff" * 5] * 39),
                dict(attention_mask=[b"\xff" * 4] * 40)]:
        assert split_forward(dataclasses.replace(good, **bad), 16, 16) is None, bad


def test_an_embed_forward_keeps_each_output_with_its_embed():
    item = p.ForwardItem([1, 2], 4, list(range(50, 70)), [19, 2], [80, 81])  # 20 inputs, a context of 20
    chunks = split_forward(item, 16, 8)
    assert [(c.item.input_embed_ids, c.item.output_indices, c.item.output_embed_ids) for c in chunks] == [
        (list(range(50, 58)), [2], [81]), (list(range(58, 66)), [], []), (list(range(66, 70)), [3], [80])]
    assert [(c.item.kv_page_ids, c.item.kv_last_page_len) for c in chunks] == [([1], 8), ([1], 16), ([1, 2], 4)]
    assert chunks[0].reads == frozenset(map(Embed, range(50, 58))) and chunks[0].writes == frozenset({Embed(81)})


def test_the_budget_by_the_device_and_within_what_the_process_takes():
    assert chunk_budget(AUTO, "cpu", 8192) == (128, 256) and chunk_budget(AUTO, "cuda:0", 8192) == (2048, 4096)
    assert chunk_budget(300, "cpu", 512) == (300, 512) and chunk_budget(1000, "cpu", 512) == (512, 512)
    assert chunk_budget(0, "cuda:0", 8192) == (0, 8192)  # off: forwards go whole


class Inst:
    """What InferenceCalls needs of an instance."""

    instance_id = "a1-chunks"

    def __init__(self):
        self.rewriting_page_ids, self.queues, self.num_queues_opened = set(), {}, 0
        self.futures = FutureTable(lambda handle: None, delivers=False)

    def queue(self, q: int):
        return self.queues[q]


def dist(token: int) -> p.TopKDist:
    return p.TopKDist(np.array([token], "<i4").tobytes(), np.array([1.0], "<f4").tobytes())


@pytest.mark.parametrize("failing", [None, 1])
def test_a_split_call_settles_once_every_chunk_has_with_its_outputs_in_order_or_the_first_failure(failing):
    """Outputs at inputs 39 and 5 of 40, chunks of 16 (one a batch): the future gets the distributions in
    the call's order, [after 39, after 5], once the last chunk is back; a failed middle chunk fails it,
    but only then (a token slot it holds must outlive every chunk in flight)."""
    calls = InferenceCalls(BatchScheduler(), on_broken=lambda inst, why: pytest.fail(why), chunk_tokens=16,
                           page_size=16)
    inst = Inst()
    q = calls.open_queue(inst)
    fut = inst.futures.create(DISTS)
    calls.submit(inst, q, "forward_text", p.ForwardTextItem(list(range(40)), list(range(40)), [1, 2, 3], 8, [39, 5]),
                 fut, num_tokens=40)
    for request_id, outputs in enumerate([[5], [], [39 - 32]]):
        assert not fut.done
        batch = calls.scheduler.form_batch(0.0, 64, 16)
        assert [c.item.output_indices for c in batch.commands] == [outputs]
        calls.sent(request_id, batch, 0.0)
        error = p.ItemError("bad_token", "no such token") if request_id == failing else None
        dists = None if error else [dist(100 + 16 * request_id + o) for o in outputs]  # 100 + the input index
        calls.settle(request_id, p.ForwardTextReply([error], [dists]))
    assert fut.done and calls.scheduler.num_pending == 0 and not calls.has_calls(inst)
    if failing is None:
        assert fut.value == [([139], [1.0]), ([105], [1.0])]
    else:
        assert fut.error == "bad_token: no such token"


def command(command_id: int, queue_id: int, num_tokens: int, enqueued_at: float) -> Command:
    return Command(command_id=command_id, queue_id=queue_id, call_type="forward_text", item=None,
                   enqueued_at=enqueued_at, num_tokens=num_tokens)


def test_a_decode_step_joins_ahead_of_older_chunks():
    """Two prompts' chunks queued before a decode step: the batch takes the oldest chunk, then the decode
    step, and the other prompt's chunk waits (by age alone it would have taken the decode step's room)."""
    scheduler = BatchScheduler()
    long_a, long_b, decoder = (scheduler.create_queue(i) for i in (1, 2, 3))
    for n in range(3):
        scheduler.submit(command(n + 1, long_a, CHUNK, 0.0))
    scheduler.submit(command(10, long_b, CHUNK, 0.5))
    scheduler.submit(command(20, decoder, 1, 1.0))
    batch = scheduler.form_batch(2.0, 64, 2 * CHUNK)
    assert [c.command_id for c in batch.commands] == [1, 20]


@pytest.mark.parametrize("flags", [[], ["--fused"]], ids=["forward", "forward-text"])
def test_the_raw_api_on_a_chunked_prompt_equals_direct_greedy(loop, inference, flags, monkeypatch):
    """The prompt's forward goes as chunks (the loop counts them: the metrics' split_forwards and
    prefill_chunks), two a batch, and the tokens are direct greedy's."""
    sent, before = record_batches(loop, monkeypatch), loop.snapshot()
    (inst,) = run(loop, "hello-python", [[PROMPT, "6", *flags]])
    assert (inst.state, inst.exit_code) == (State.FINISHED, 0), inst.error
    prompt_tokens = len(Tokenizer(loop.info.tokenizer).encode(PROMPT))
    assert prompt_tokens > 8 * CHUNK
    assert messages(loop, inst) == [" ".join(map(str, direct_greedy(inference, loop, PROMPT, 6)))]
    # two chunks a batch (the queue's next chunk joins its predecessor's batch), then a step a token
    whole, rest = divmod(prompt_tokens, 2 * CHUNK)
    assert sent == [2 * CHUNK] * whole + [rest] + [1] * 5
    chunked = loop.snapshot()
    assert chunked.num_split_forwards - before.num_split_forwards == 1
    assert chunked.num_prefill_chunks - before.num_prefill_chunks == -(-prompt_tokens // CHUNK)
    assert_pools_full(loop)


def test_pipelined_decode_after_a_chunked_prompt_equals_direct_greedy(loop, inference, monkeypatch):
    """The SDK's generate sends the prompt with the first token's sample (forward-sample): the sample
    goes with the last chunk, and the decode steps after it are fed by that token's future."""
    sent = record_batches(loop, monkeypatch)
    (inst,) = run(loop, "text-completion", [[PROMPT, "6"]])
    assert inst.exit_code == 0, inst.error
    assert messages(loop, inst) == [" ".join(map(str, direct_greedy(inference, loop, PROMPT, 6)))]
    assert max(sent) <= 2 * CHUNK
    assert_pools_full(loop)


def test_distributions_after_every_token_of_a_chunked_prompt_equal_one_whole_forward(loop, inference):
    """``Context.dists`` over the whole prompt: its outputs fall in every chunk, and come back in order,
    each the distribution one unchunked forward of the prompt gives there."""
    (inst,) = run(loop, "conformance", [[f"dists|{PROMPT}|3"]])
    assert inst.exit_code == 0, inst.error
    got = json.loads(messages(loop, inst)[0])["token_ids"]
    tokens = Tokenizer(loop.info.tokenizer).encode(PROMPT)
    page_size, n = loop.info.page_size, len(tokens)
    pages = list(range((n + page_size - 1) // page_size))
    with inference.client() as client:  # nothing else runs now: the pages' contents are this call's
        reply = client.call(p.ForwardTextRequest([p.ForwardTextItem(
            tokens, list(range(n)), pages, n - (len(pages) - 1) * page_size, list(range(n)), 3)]))
    assert got == [np.frombuffer(d.token_ids, "<i4").tolist() for d in reply.dists[0]]


def record_batches(loop, monkeypatch) -> list[int]:
    """The input tokens of each forward batch the loop sends from now on."""
    (replica,) = loop.replicas
    sent, send = [], replica.client.send

    def recording(request):
        if isinstance(request, (p.ForwardRequest, p.ForwardTextRequest)):
            sent.append(p.num_batch_tokens(request))
        return send(request)
    monkeypatch.setattr(replica.client, "send", recording)
    return sent
