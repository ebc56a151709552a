"""The calls instances make to the inference process, from submission until their futures settle.

An instance's call becomes a :class:`Command` in one of its scheduler queues
(:meth:`InferenceCalls.submit`); the loop sends the batches the scheduler forms
(:meth:`~InferenceCalls.sent`) and hands each reply back
(:meth:`~InferenceCalls.settle`), which completes or fails the futures of the
batch's calls in order. Command and request ids never leave this module.
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
    """

    def __init__(self, scheduler: BatchScheduler, on_broken: Callable[[Instance, str], None],
                 on_batch: Callable[[str, int, int, float], None] | None = None):
        self.scheduler = scheduler
        self._on_broken, self._on_batch = on_broken, on_batch
        self._last_settled_at = 0.0
        # Seconds the inference process took over every batch, and the share of the forward-text items that
        # rewrite discarded K/V (the SDKs' recomputes, recompute.py: see _rewrites). Recomputing's memory
        # waste (InferCept's WasteDiscard): that share x the KvPages of the whole batch, which every
        # instance in it holds while the recompute lengthens its step.
        self.device_s = self.rewrite_s = self.rewrite_page_s = 0.0
        self._rewrite_command_ids: set[int] = set()
        self._by_command_id: dict[int, tuple[Instance, Future]] = {}
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
        command = Command(command_id=next(self._command_ids), queue_id=state.scheduler_queue_id,
                          call_type=call_type, item=item, enqueued_at=time.monotonic(),
                          num_tokens=max(1, num_tokens), reads=reads, writes=writes, kv_context=kv_context)
        self._by_command_id[command.command_id] = (inst, fut)
        if call_type == "forward_text" and _rewrites(inst, item):
            self._rewrite_command_ids.add(command.command_id)
        state.track(fut)
        self.scheduler.submit(command)

    def has_calls(self, inst: Instance) -> bool:
        """Whether ``inst`` has a call queued or in flight."""
        return any(owner is inst for owner, _ in self._by_command_id.values())

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
            inst, fut = self._by_command_id.pop(command.command_id, (None, None))
            if inst is None:
                continue
            try:
                _settle(inst, fut, reply, i)
                if metrics is not None and fut.kind in (TOKEN, DISTS) and not isinstance(reply, p.ErrorReply) \
                        and reply.errors[i] is None:
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
            inst, fut = self._by_command_id.pop(command.command_id, (None, None))
            if inst is not None:
                inst.futures.fail(fut, error)


def _rewrites(inst: Instance, item: p.ForwardTextItem) -> bool:
    """Whether a forward rewrites K/V the server discarded: it asks for no distribution and ends on a
    page restore-discarded gave back (an SDK recompute's chunk); the pages it covers are rewritten then.
    A prefill that asks for no distribution is no recompute."""
    if item.output_indices or not item.kv_page_ids or item.kv_page_ids[-1] not in inst.rewriting_page_ids:
        return False
    inst.rewriting_page_ids.difference_update(item.kv_page_ids)
    return True


def _settle(inst: Instance, fut: Future, reply, i: int) -> None:
    """Complete item ``i``'s future from a batch reply."""
    if isinstance(reply, p.ErrorReply):
        inst.futures.fail(fut, f"{reply.code}: {reply.message}")
    elif reply.errors[i] is not None:
        inst.futures.fail(fut, f"{reply.errors[i].code}: {reply.errors[i].message}")
    elif fut.kind == TOKEN:
        logprobs = reply.logprobs[i] if reply.logprobs else None
        inst.futures.complete(fut, reply.sampled[i] if logprobs is None else [
            reply.sampled[i], logprobs.logprob, *_decode_dist(p.TopKDist(logprobs.top_ids, logprobs.top_logprobs))])
    elif fut.kind == DISTS:
        dists = reply.dists[i] if isinstance(reply.dists[i], list) else [reply.dists[i]]
        inst.futures.complete(fut, [_decode_dist(d) for d in dists])
    else:
        inst.futures.complete(fut)


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
