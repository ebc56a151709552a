"""Batchable commands and the per-inferlet FIFO queues that hold them until dispatch.

A command is one item of one inference call type (``proto.inference.CALL_TYPES``),
already translated to physical ids. The scheduler never looks inside ``item``:
what it needs to know (cost, call type, footprint, age) is spelled out on the
command.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

from oven.proto import inference as p

from .footprint import Resource, forward_kv_footprint

__all__ = ["Command", "CommandQueue"]


# eq=False: commands are equal only to themselves (items hold lists, so they
# could not be hashed by value anyway).
@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Command:
    """One call waiting in a queue.

    ``num_tokens`` is what the command costs against the inference layer's
    ``max_batch_tokens``: its input tokens for ``embed_text``, ``forward`` and
    ``forward_text``, 1 for every other call type. ``reads`` / ``writes`` name
    the physical memory it touches (see :mod:`.footprint`); leaving out
    something it writes can let a conflicting command into the same batch.
    A forward names its paged context instead as ``kv_context`` =
    (kv_page_ids, kv_last_page_len, num_inputs, page_size): :meth:`footprint`
    adds its KvPage slots only when the scheduler asks, which is only when a
    second command of the same queue could join the batch; a decode step is
    never asked. ``enqueued_at`` is the caller's clock at submission, in seconds.

    Raises ValueError for an unknown call type or a cost below 1.
    """

    command_id: int
    queue_id: int
    call_type: str
    item: object
    enqueued_at: float
    num_tokens: int = 1
    reads: frozenset[Resource] = frozenset()
    writes: frozenset[Resource] = frozenset()
    kv_context: tuple[list[int], int, int, int] | None = None

    def __post_init__(self) -> None:
        if self.call_type not in p.CALL_TYPES:
            raise ValueError(f"unknown call type {self.call_type!r} (expected one of {sorted(p.CALL_TYPES)})")
        if self.num_tokens < 1:
            raise ValueError(f"num_tokens must be at least 1, got {self.num_tokens}")

    def footprint(self) -> tuple[frozenset[Resource], frozenset[Resource]]:
        """(reads, writes), with the KvPage slots of ``kv_context`` when there is one."""
        if self.kv_context is None:
            return self.reads, self.writes
        try:
            kv_reads, kv_writes = forward_kv_footprint(*self.kv_context)
        except ValueError:  # a malformed context: the inference layer fails the item with the exact error
            return self.reads, self.writes
        return self.reads | kv_reads, self.writes | kv_writes


class CommandQueue:
    """One inferlet's commands in submission order; higher ``priority`` is served first.

    Batches run in the order they are dispatched (one inference process serves
    requests in arrival order), so a command never has to wait for its
    predecessors' batches to *finish*: being behind them in the queue is enough.
    """

    __slots__ = ("queue_id", "instance_id", "priority", "_commands")

    def __init__(self, queue_id: int, instance_id: int, priority: int = 0):
        self.queue_id = queue_id
        self.instance_id = instance_id
        self.priority = priority
        self._commands: deque[Command] = deque()

    def __len__(self) -> int:
        return len(self._commands)

    def __iter__(self) -> Iterator[Command]:
        return iter(self._commands)

    @property
    def head(self) -> Command | None:
        return self._commands[0] if self._commands else None

    def append(self, command: Command) -> None:
        """Raises ValueError if the command names another queue or is older than the tail.

        Keeping ``enqueued_at`` non-decreasing makes the head the oldest command.
        """
        if command.queue_id != self.queue_id:
            raise ValueError(f"command {command.command_id} names queue {command.queue_id}, not {self.queue_id}")
        if self._commands and command.enqueued_at < self._commands[-1].enqueued_at:
            raise ValueError(f"command {command.command_id} was enqueued before the queue's last command")
        self._commands.append(command)

    def pop_front(self, num_commands: int) -> list[Command]:
        return [self._commands.popleft() for _ in range(num_commands)]

    def drain(self) -> list[Command]:
        commands = list(self._commands)
        self._commands.clear()
        return commands
