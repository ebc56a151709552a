"""Batch formation over many command queues (Pie §5.2): horizontal and vertical batching.

Mechanism only: :mod:`.policy` decides *when* to call :meth:`BatchScheduler.form_batch`.
Everything here is pure bookkeeping driven by the caller's clock, with no I/O.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import islice

from oven.proto import inference as p

from .commands import Command, CommandQueue
from .conflicts import QueueFootprint
from .footprint import TokenSlot

__all__ = ["Batch", "SchedulerStats", "BatchScheduler"]


@dataclass(frozen=True, slots=True)
class Batch:
    """Commands of one call type, in the order their items are sent.

    Queues appear by priority (highest first, then by age); each queue's
    commands keep their FIFO order.
    """

    call_type: str
    commands: tuple[Command, ...]
    formed_at: float

    @property
    def items(self) -> list[object]:
        return [c.item for c in self.commands]

    @property
    def num_tokens(self) -> int:
        return sum(c.num_tokens for c in self.commands)

    def to_request(self):
        """The proto request carrying this batch (e.g. a ``ForwardRequest``)."""
        return p.REQUEST_BY_CALL_TYPE[self.call_type](self.items)


@dataclass(frozen=True, slots=True)
class SchedulerStats:
    """Counters since the scheduler was made. A batch can be both horizontal and vertical."""

    num_batches: int = 0
    num_commands: int = 0
    num_horizontal_batches: int = 0  # items from at least two queues
    num_vertical_batches: int = 0  # at least two items from one queue
    batch_size_histogram: tuple[tuple[int, int], ...] = ()  # (num_commands, num_batches), ascending
    total_wait_s: float = 0.0  # summed over dispatched commands: formed_at - enqueued_at

    @staticmethod
    def combined(stats: Iterable[SchedulerStats]) -> SchedulerStats:
        """The counters of several schedulers (one per inference replica) added up."""
        stats = list(stats)
        histogram: Counter[int] = Counter()
        for s in stats:
            histogram.update(dict(s.batch_size_histogram))
        return SchedulerStats(sum(s.num_batches for s in stats), sum(s.num_commands for s in stats),
                              sum(s.num_horizontal_batches for s in stats), sum(s.num_vertical_batches for s in stats),
                              tuple(sorted(histogram.items())), sum(s.total_wait_s for s in stats))

    @property
    def mean_batch_size(self) -> float:
        return self.num_commands / self.num_batches if self.num_batches else 0.0

    @property
    def mean_wait_s(self) -> float:
        return self.total_wait_s / self.num_commands if self.num_commands else 0.0


class BatchScheduler:
    """Holds the command queues and forms batches from them.

    Batch formation, in :meth:`form_batch`:

    1. **Call type.** The *anchor* is the queue head that has waited longest
       (ties: higher queue priority, then lower queue id); the batch takes its
       call type. The anchor is always in the batch, so every command is
       eventually dispatched whatever the priorities.
    2. **Horizontal.** Heads of that call type across queues join, by queue
       priority (highest first), then size (fewest tokens first: a decode step
       before a chunk of a long prompt, so that decoding instances step in every
       batch whatever prompts are being forwarded beside them), then age, first
       fit: a head that would overflow ``max_tokens`` stays for a later batch and
       smaller heads behind it may still join.
    3. **Vertical.** Then, queue by queue in the same order, the commands right
       behind each chosen head join while they are of the same call type, fit,
       and do not conflict with what the batch already took from that queue
       (rules in :mod:`.footprint`); the first that fails ends that queue's run.

    A command fed by a token future (it reads a :class:`TokenSlot`) joins no batch while the command
    that samples that token is still pending, in this batch or behind: the inference process must
    have run the sampling step first. Its own queue orders it behind that step anyway; this holds
    the rule across queues (a fork fed by its parent's future). The anchor is never held so: the
    sampling step's queue has a head older than any command issued after it.

    A command is never split. An anchor costing more than ``max_tokens`` is
    dispatched alone: were it held back it would block its queue forever, and
    only the inference layer can say whether it fits after all (it fails that
    item alone if not).
    """

    def __init__(self) -> None:
        self._queues: dict[int, CommandQueue] = {}
        self._nonempty: dict[int, CommandQueue] = {}
        # Heap of (enqueued_at, command_id) of pending commands; entries of commands that have
        # left (batched or dropped) are discarded lazily, so the oldest costs O(log n), not O(queues).
        self._by_age: list[tuple[float, int]] = []
        self._pending_ids: set[int] = set()
        self._next_queue_id = 1
        self._num_pending = 0
        self._num_pending_chained = 0
        self._pending_token_writes: Counter[int] = Counter()  # token slot -> pending commands sampling into it
        self._num_batches = self._num_commands = 0
        self._num_horizontal = self._num_vertical = 0
        self._batch_sizes: Counter[int] = Counter()
        self._total_wait_s = 0.0

    # -- queues -----------------------------------------------------------

    def create_queue(self, instance_id: int, priority: int = 0) -> int:
        """A new empty queue owned by inferlet instance ``instance_id``; returns its queue id."""
        queue_id = self._next_queue_id
        self._next_queue_id += 1
        self._queues[queue_id] = CommandQueue(queue_id, instance_id, priority)
        return queue_id

    def queue(self, queue_id: int) -> CommandQueue:
        """Raises KeyError for an unknown queue."""
        return self._queues[queue_id]

    def set_priority(self, queue_id: int, priority: int) -> None:
        """Higher runs first; takes effect at the next :meth:`form_batch`. Raises KeyError."""
        self._queues[queue_id].priority = priority

    def remove_queue(self, queue_id: int) -> list[Command]:
        """Drop a queue; returns its pending commands in FIFO order, for the caller to fail.

        Raises KeyError for an unknown queue.
        """
        queue = self._queues.pop(queue_id)
        self._nonempty.pop(queue_id, None)
        dropped = queue.drain()
        self._num_pending -= len(dropped)
        self._num_pending_chained -= sum(map(_chained, dropped))
        self._forget_token_writes(dropped)
        self._pending_ids.difference_update(c.command_id for c in dropped)
        return dropped

    def remove_instance(self, instance_id: int) -> list[Command]:
        """Drop every queue of a killed inferlet; returns their pending commands, queue by queue."""
        owned = [qid for qid, q in self._queues.items() if q.instance_id == instance_id]
        return [c for qid in owned for c in self.remove_queue(qid)]

    # -- commands ---------------------------------------------------------

    def submit(self, command: Command) -> None:
        """Append to ``command.queue_id``'s queue.

        Raises KeyError for an unknown queue and ValueError if the command is
        older than the queue's last one.
        """
        queue = self._queues[command.queue_id]
        queue.append(command)
        self._nonempty[queue.queue_id] = queue
        self._num_pending += 1
        self._num_pending_chained += _chained(command)
        self._pending_token_writes.update(r.slot_id for r in command.writes if isinstance(r, TokenSlot))
        self._pending_ids.add(command.command_id)
        heapq.heappush(self._by_age, (command.enqueued_at, command.command_id))

    @property
    def num_pending(self) -> int:
        return self._num_pending

    @property
    def num_pending_chained(self) -> int:
        """Pending commands fed by a token future (they read a :class:`TokenSlot`): each may go out
        while the batch that samples its token runs, see ``AdaptivePolicy``."""
        return self._num_pending_chained

    @property
    def oldest_enqueued_at(self) -> float | None:
        """``enqueued_at`` of the oldest pending command; None when nothing is pending."""
        while self._by_age and self._by_age[0][1] not in self._pending_ids:
            heapq.heappop(self._by_age)
        return self._by_age[0][0] if self._by_age else None

    # -- batches ----------------------------------------------------------

    def form_batch(self, now: float, max_items: int, max_tokens: int) -> Batch | None:
        """Take the next batch out of the queues (see the class docstring); None if nothing is pending.

        Raises ValueError unless ``max_items`` and ``max_tokens`` are at least 1.
        """
        if max_items < 1 or max_tokens < 1:
            raise ValueError(f"max_items and max_tokens must be at least 1, got {max_items}, {max_tokens}")
        if not self._nonempty:
            return None
        anchor = min(self._nonempty.values(), key=lambda q: (q.head.enqueued_at, -q.priority, q.queue_id))
        call_type = anchor.head.call_type
        if anchor.head.num_tokens > max_tokens:
            runs = {anchor.queue_id: 1}
        else:
            runs = self._plan(anchor, call_type, max_items, max_tokens)
        ordered = sorted((self._queues[qid] for qid in runs),
                         key=lambda q: (-q.priority, q.head.enqueued_at, q.queue_id))
        commands = tuple(c for q in ordered for c in self._pop(q, runs[q.queue_id]))
        batch = Batch(call_type, commands, now)
        self._count(batch, runs)
        return batch

    def _plan(self, anchor: CommandQueue, call_type: str, max_items: int, max_tokens: int) -> dict[int, int]:
        """How many commands to take from the front of each queue: queue id -> count."""
        candidates = sorted((q for q in self._nonempty.values() if q.head.call_type == call_type),
                            key=lambda q: (-q.priority, q.head.num_tokens, q.head.enqueued_at, q.queue_id))
        num_items, num_tokens = 1, anchor.head.num_tokens
        runs = {anchor.queue_id: 1}
        for q in candidates:
            if num_items == max_items:
                break
            if q is not anchor and num_tokens + q.head.num_tokens <= max_tokens and not self._unsampled(q.head):
                runs[q.queue_id] = 1
                num_items += 1
                num_tokens += q.head.num_tokens
        for q in candidates:
            if q.queue_id not in runs or len(q) == 1:  # the common decode case: no run to check
                continue
            footprint = None  # built once a follower of the same type could join: footprints cost
            for command in islice(q, 1, None):
                if (num_items == max_items or command.call_type != call_type
                        or num_tokens + command.num_tokens > max_tokens or self._unsampled(command)):
                    break
                if footprint is None:
                    footprint = QueueFootprint()
                    footprint.add(q.head)
                if not footprint.admit(command):
                    break
                runs[q.queue_id] += 1
                num_items += 1
                num_tokens += command.num_tokens
        return runs

    def _pop(self, queue: CommandQueue, num_commands: int) -> list[Command]:
        commands = queue.pop_front(num_commands)
        if not len(queue):
            del self._nonempty[queue.queue_id]
        self._num_pending -= num_commands
        self._num_pending_chained -= sum(map(_chained, commands))
        self._forget_token_writes(commands)
        self._pending_ids.difference_update(c.command_id for c in commands)
        return commands

    def _unsampled(self, command: Command) -> bool:
        """Whether ``command`` is fed by a token that a pending command has yet to sample."""
        return bool(self._pending_token_writes) and any(
            isinstance(r, TokenSlot) and self._pending_token_writes[r.slot_id] for r in command.reads)

    def _forget_token_writes(self, commands: list[Command]) -> None:
        for command in commands:
            for r in command.writes:
                if isinstance(r, TokenSlot):
                    self._pending_token_writes[r.slot_id] -= 1
                    if not self._pending_token_writes[r.slot_id]:
                        del self._pending_token_writes[r.slot_id]

    def _count(self, batch: Batch, runs: dict[int, int]) -> None:
        size = len(batch.commands)
        self._num_batches += 1
        self._num_commands += size
        self._num_horizontal += len(runs) >= 2
        self._num_vertical += max(runs.values()) >= 2
        self._batch_sizes[size] += 1
        self._total_wait_s += sum(batch.formed_at - c.enqueued_at for c in batch.commands)

    def stats(self) -> SchedulerStats:
        """A snapshot of the counters."""
        return SchedulerStats(
            num_batches=self._num_batches,
            num_commands=self._num_commands,
            num_horizontal_batches=self._num_horizontal,
            num_vertical_batches=self._num_vertical,
            batch_size_histogram=tuple(sorted(self._batch_sizes.items())),
            total_wait_s=self._total_wait_s,
        )


def _chained(command: Command) -> bool:
    return any(isinstance(r, TokenSlot) for r in command.reads)
