"""The calls instances make to the inference process, from submission until their futures settle.

An instance's call becomes a :class:`Command` in one of its scheduler queues
(:meth:`InferenceCalls.submit`); the loop sends the batches the scheduler forms
(:meth:`~InferenceCalls.sent`) and hands each reply back
(:meth:`~InferenceCalls.settle`), which completes or fails the futures of the
batch's calls in order. A forward of more than ``chunk_tokens`` inputs is queued
as chunks (:mod:`oven.control.scheduling.chunks`) whose results gather into its
one future. Command and request ids never leave this module.
"""

from __future__ import annotations

import array
import itertools
import logging
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from oven.control.scheduling.batcher import Batch, BatchScheduler
from oven.control.scheduling.chunks import split_forward
from oven.control.scheduling.commands import Command
from oven.control.scheduling.footprint import Resource
from oven.proto import inference as p

from .decoders import DecoderIds
from .futures import DISTS, TOKEN, Future
from .queues import QueueState
from .token_slots import TokenSlots

if TYPE_CHECKING:
    from oven.control.metrics import ControlMetrics

    from .instance import Instance

log = logging.getLogger(__name__)


class Submit(Protocol):
    def __call__(self, inst: Instance, q: int, call_type: str, item: object, fut: Future, *, num_tokens: int = 1,
                 reads: frozenset[Resource] = frozenset(), writes: frozenset[Resource] = frozenset(),
                 kv_context: tuple[list[int], int, int, int] | None = None) -> None: ...


class InferenceCalls:
    """Every call queued or in flight, by command id, with the instance and future it answers.

    ``on_broken(inst, reason)`` is called when completing one of ``inst``'s
    calls raised: a bookkeeping bug costs that instance, never the loop.
    ``on_batch(call_type, num_items, num_tokens, seconds)`` hears of every answered
    batch and how long the device took over it (the cost profiler's input).
    ``chunk_tokens``: a forward of more inputs is split into chunks of that many (0: never), over
    pages of ``page_size`` tokens.
    """

    def __init__(self, scheduler: BatchScheduler, on_broken: Callable[[Instance, str], None],
                 on_batch: Callable[[str, int, int, float], None] | None = None, chunk_tokens: int = 0,
                 page_size: int = 16):
        self.scheduler = scheduler
        self.chunk_tokens, self.page_size = chunk_tokens, page_size
        self.num_split = self.num_chunks = 0  # forwards split into chunks, and the chunks they made
        self._on_broken, self._on_batch = on_broken, on_batch
        self._last_settled_at = 0.0
        # Seconds the inference process took over every batch, and the share of the forward-text items that
        # rewrite discarded K/V (the SDKs' recomputes, recompute.py: see _rewrites). Recomputing's memory
        # waste (InferCept's WasteDiscard): that share x the KvPages of the whole batch, which every
        # instance in it holds while the recompute lengthens its step.
        self.device_s = self.rewrite_s = self.rewrite_page_s = 0.0
        self._rewrite_command_ids: set[int] = set()
        # command id -> whose call, its future, and for a chunk of a split forward what gathers its results
        # and where its outputs sit among the forward's
        self._by_command_id: dict[int, tuple[Instance, Future, tuple[_Gather, list[int]] | None]] = {}
        self._in_flight: dict[int, tuple[Batch, float]] = {}  # request id -> (batch, when sent), oldest first
        self._command_ids = itertools.count(1)
        self.token_slots = TokenSlots()  # the inference process's token future slots in use
        self.decoder_ids = DecoderIds()  # and its decoders
        self.metrics: ControlMetrics | None = None  # told of each batch sent and each output settled

    # -- an instance's queues --------------------------------------------------------------------

    def open_queue(self, inst: Instance, priority: int = 0) -> int:
        """A new command queue of ``inst``; its virtual id (0 for the first, then counting up: an id is
        never reused, and the runner counts the same way)."""
        q = inst.num_queues_opened
        inst.num_queues_opened += 1
        inst.queues[q] = QueueState(self.scheduler.create_queue(scheduler_key(inst.instance_id), priority))
        return q

    def close_queue(self, inst: Instance, q: int) -> None:
        """Destroy queue ``q``, failing what waits in it; ValueError for queue 0 or an unknown one."""
        if q == 0:
            raise ValueError("queue 0 cannot be destroyed")
        state = inst.queues.pop(q, None)
        if state is None:
            raise ValueError(f"queue {q} does not exist in this inferlet")
        self._fail(self.scheduler.remove_queue(state.scheduler_queue_id), "its queue was destroyed")

    def set_priority(self, inst: Instance, q: int, priority: int) -> None:
        self.scheduler.set_priority(inst.queue(q).scheduler_queue_id, priority)

    def drop_instance(self, inst: Instance) -> None:
        """Fail every call ``inst`` still has queued (those in flight settle when their reply comes)."""
        self._fail(self.scheduler.remove_instance(scheduler_key(inst.instance_id)), "the instance ended")

    # -- calls -----------------------------------------------------------------------------------

    def submit(self, inst: Instance, q: int, call_type: str, item: object, fut: Future, *, num_tokens: int = 1,
               reads: frozenset[Resource] = frozenset(), writes: frozenset[Resource] = frozenset(),
               kv_context: tuple[list[int], int, int, int] | None = None) -> None:
        """Queue one call on ``inst``'s queue ``q``; ``fut`` settles with its outcome (see :class:`Command`
        for the other arguments). ValueError for an unknown queue."""
        state = inst.queue(q)
        rewrites = call_type == "forward_text" and _rewrites(inst, item)
        now = time.monotonic()
        pieces = [(item, num_tokens, reads, writes, kv_context, None)]
        if 0 < self.chunk_tokens < num_tokens and call_type in CHUNKED:  # never true of a decode step
            chunks = split_forward(item, self.page_size, self.chunk_tokens)
            if chunks is not None:
                self.num_split += 1
                self.num_chunks += len(chunks)
                gather = _Gather(len(chunks), len(item.output_indices))
                pieces = [(c.item, c.num_tokens, c.reads, c.writes, c.kv_context, (gather, c.outputs)) for c in chunks]
        for piece, cost, piece_reads, piece_writes, piece_context, part in pieces:
            command = Command(command_id=next(self._command_ids), queue_id=state.scheduler_queue_id,
                              call_type=call_type, item=piece, enqueued_at=now, num_tokens=max(1, cost),
                              reads=piece_reads, writes=piece_writes, kv_context=piece_context)
            self._by_command_id[command.command_id] = (inst, fut, part)
            if rewrites:
                self._rewrite_command_ids.add(command.command_id)
            self.scheduler.submit(command)
        state.track(fut)

    def has_calls(self, inst: Instance) -> bool:
        """Whether ``inst`` has a call queued or in flight."""
        return any(owner is inst for owner, _, _ in self._by_command_id.values())

    # -- batches ---------------------------------------------------------------------------------

    def sent(self, request_id: int, batch: Batch, now: float) -> None:
        self._in_flight[request_id] = (batch, now)
        if self.metrics is not None:
            owners = (self._by_command_id.get(c.command_id, (None,))[0] for c in batch.commands)
            self.metrics.batch_sent((inst.instance_id for inst in owners if inst is not None), now)

    @property
    def num_in_flight(self) -> int:
        """Batches sent and not answered yet."""
        return len(self._in_flight)

    @property
    def oldest_sent_at(self) -> float | None:
        """When the oldest unanswered batch was sent; None when none is in flight."""
        return next(iter(self._in_flight.values()))[1] if self._in_flight else None

    def settle(self, request_id: int, reply) -> None:
        """Settle the futures of the batch sent as ``request_id`` from its reply (a request id
        that is not in flight, say one lost with a dead inference process, is ignored)."""
        batch, sent_at = self._in_flight.pop(request_id, (None, 0.0))
        if batch is None:
            return
        now = time.monotonic()
        # Replies come in order: a batch starts when the one before it ended.
        seconds = now - max(sent_at, self._last_settled_at)
        self.device_s += seconds
        if batch.call_type == "forward_text":
            rewrites = [c for c in batch.commands if c.command_id in self._rewrite_command_ids]
            self._rewrite_command_ids.difference_update(c.command_id for c in rewrites)
            num_rewrite_tokens = sum(c.num_tokens for c in rewrites)
            if num_rewrite_tokens:
                rewrite_s = seconds * num_rewrite_tokens / batch.num_tokens
                self.rewrite_s += rewrite_s
                self.rewrite_page_s += rewrite_s * sum(len(c.item.kv_page_ids) for c in batch.commands)
        if self._on_batch is not None:
            self._on_batch(batch.call_type, len(batch.commands), batch.num_tokens, seconds)
        self._last_settled_at = now
        metrics = self.metrics
        for i, command in enumerate(batch.commands):
            inst, fut, part = self._by_command_id.pop(command.command_id, (None, None, None))
            if inst is None:
                continue
            try:
                done = _settle(inst, fut, reply, i) if part is None else _settle_chunk(inst, fut, part, reply, i)
                if metrics is not None and done and fut.kind in (TOKEN, DISTS):
                    metrics.output(inst.instance_id, now)
            except Exception as exc:  # a bookkeeping bug hits one instance, never the loop
                log.exception("completing a %s call of %s failed", command.call_type, inst.instance_id)
                self._on_broken(inst, f"internal error: {type(exc).__name__}: {exc}")

    def forget_in_flight(self) -> None:
        """Forget every call in flight, its futures unsettled: the inference process is gone, no reply
        will come, and the caller has killed every instance that had one (:meth:`has_calls`)."""
        for batch, _ in self._in_flight.values():
            for command in batch.commands:
                self._by_command_id.pop(command.command_id, None)
        self._in_flight.clear()
        self.token_slots.reset()
        self.decoder_ids.reset()

    def _fail(self, commands: list[Command], error: str) -> None:
        for command in commands:
            self._rewrite_command_ids.discard(command.command_id)
            inst, fut, part = self._by_command_id.pop(command.command_id, (None, None, None))
            if inst is None:
                continue
            if part is None:
                inst.futures.fail(fut, error)
            else:
                gather, _ = part
                gather.settled(inst, fut, error)


CHUNKED = ("forward", "forward_text")  # the call types a long one of which is split


def _rewrites(inst: Instance, item: p.ForwardTextItem) -> bool:
    """Whether a forward rewrites K/V the server discarded: it asks for no distribution and ends on a
    page restore-discarded gave back (an SDK recompute's chunk); the pages it covers are rewritten then.
    A prefill that asks for no distribution is no recompute."""
    if item.output_indices or not item.kv_page_ids or item.kv_page_ids[-1] not in inst.rewriting_page_ids:
        return False
    inst.rewriting_page_ids.difference_update(item.kv_page_ids)
    return True


class _Gather:
    """A split forward's results so far, for its one future. The future settles once every chunk has, as
    an unsplit call's does with its one command: until then the token slot it samples into is held."""

    __slots__ = ("pending", "dists", "token", "failure")

    def __init__(self, num_chunks: int, num_outputs: int):
        self.pending = num_chunks
        self.dists: list[p.TopKDist | None] = [None] * num_outputs  # in the call's output order
        self.token = None  # a TOKEN future's value, from the chunk that samples
        self.failure: str | None = None  # the first chunk's that failed

    def settled(self, inst: Instance, fut: Future, failure: str | None) -> bool:
        """One more chunk settled (``failure``: how it failed); settle the future after the last. Whether
        it completed."""
        self.failure = self.failure or failure
        self.pending -= 1
        if self.pending:
            return False
        if self.failure is not None:
            inst.futures.fail(fut, self.failure)
            return False
        _complete(inst, fut, self.token, self.dists)
        return True


def _failure(reply, i: int) -> str | None:
    if isinstance(reply, p.ErrorReply):
        return f"{reply.code}: {reply.message}"
    if reply.errors[i] is not None:
        return f"{reply.errors[i].code}: {reply.errors[i].message}"
    return None


def _token(reply, i: int):
    """A TOKEN future's value: the sampled token, or with log-probabilities [token, logprob, ids, probs]."""
    logprobs = reply.logprobs[i] if reply.logprobs else None
    return reply.sampled[i] if logprobs is None else [
        reply.sampled[i], logprobs.logprob, *_decode_dist(p.TopKDist(logprobs.top_ids, logprobs.top_logprobs))]


def _dists(reply, i: int) -> list[p.TopKDist]:
    return reply.dists[i] if isinstance(reply.dists[i], list) else [reply.dists[i]]


def _settle(inst: Instance, fut: Future, reply, i: int) -> bool:
    """Complete or fail item ``i``'s future from a batch reply; whether it completed."""
    if (failure := _failure(reply, i)) is not None:
        inst.futures.fail(fut, failure)
        return False
    _complete(inst, fut, _token(reply, i) if fut.kind == TOKEN else None,
              _dists(reply, i) if fut.kind == DISTS else None)
    return True


def _complete(inst: Instance, fut: Future, token, dists: list[p.TopKDist] | None) -> None:
    """Complete ``fut`` with what its kind gives: a TOKEN future's ``token``, a DISTS future's ``dists``."""
    if fut.kind == TOKEN:
        inst.futures.complete(fut, token)
    elif fut.kind == DISTS:
        inst.futures.complete(fut, [_decode_dist(d) for d in dists])
    else:
        inst.futures.complete(fut)


def _settle_chunk(inst: Instance, fut: Future, part: tuple[_Gather, list[int]], reply, i: int) -> bool:
    """Gather item ``i``, a chunk of a split forward (``part``: its gather, and where its outputs sit
    among the forward's); whether the forward's future completed with it."""
    gather, outputs = part
    failure = _failure(reply, i)
    if failure is None and fut.kind == DISTS:
        for j, dist in zip(outputs, _dists(reply, i)):
            gather.dists[j] = dist
    elif failure is None and fut.kind == TOKEN and reply.sampled and reply.sampled[i] is not None:
        gather.token = _token(reply, i)  # the chunk that samples
    return gather.settled(inst, fut, failure)


def _decode_dist(dist: p.TopKDist) -> tuple[list[int], list[float]]:
    """Little-endian int32 ids and float32 probabilities (see proto/inference.py) as Python lists."""
    ids, probs = array.array("i", dist.token_ids), array.array("f", dist.probs)
    if sys.byteorder == "big":
        ids.byteswap()
        probs.byteswap()
    return ids.tolist(), probs.tolist()


def scheduler_key(instance_id: str) -> int:
    """The scheduler's key for an instance: the serial number that starts its id."""
    return int(instance_id.split("-", 1)[0], 16)
