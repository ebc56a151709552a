"""Command queues: calls on one queue run in order; contexts on different queues batch together."""

from __future__ import annotations

from componentize_py_types import Err
from wit_world.imports import futures, queues

from .tasks import HostFuture

_idle: list[int] = []  # queues of closed contexts, reused: destroying one would fail its pending calls


class Queue:
    """One command queue plus the calls on it whose (unit) results nobody awaits.

    Those are checked once a later call of the queue completes: calls complete in
    issue order, so an error in, say, a mask is reported with the next awaited result.
    """

    __slots__ = ("id", "_unchecked")

    def __init__(self, priority: int = 0, queue_id: int | None = None):
        if queue_id is None and _idle:
            queue_id = _idle.pop()
            queues.set_priority(queue_id, priority)
        elif queue_id is None:
            queue_id = queues.create_queue(priority)
        self.id, self._unchecked = queue_id, []

    def later(self, handle: int) -> None:
        """A unit call issued on this queue whose completion nobody waits for."""
        self._unchecked.append(handle)

    def has_unchecked(self) -> bool:
        return bool(self._unchecked)

    def result(self, handle: int, take) -> HostFuture:
        """The awaitable result of a call on this queue; completing it checks the earlier unit calls."""
        if not self._unchecked:
            return HostFuture(handle, take)

        def take_then_check(h: int):
            value = take(h)
            self._check()
            return value
        return HostFuture(handle, take_then_check)

    def unit(self, handle: int) -> HostFuture:
        return self.result(handle, futures.take_unit)

    def _check(self) -> None:
        """Take the finished unchecked calls; a failed one raises (as the awaited call's error)."""
        if not self._unchecked:  # another call's completion checked them already
            return
        done = set(futures.poll(self._unchecked))
        self._unchecked = [h for h in self._unchecked if h not in done]
        errors = []
        for handle in done:
            try:
                futures.take_unit(handle)
            except Err as err:
                errors.append(err)
        if errors:
            raise errors[0]

    def synchronize(self) -> HostFuture:
        return self.unit(queues.synchronize(self.id))

    def set_priority(self, priority: int) -> None:
        queues.set_priority(self.id, priority)

    def close(self) -> None:
        """Forget the unchecked calls (their errors would otherwise surface in the queue's next user)
        and keep the queue for reuse."""
        for handle in self._unchecked:
            futures.discard(handle)
        self._unchecked = []
        if self.id != 0:
            _idle.append(self.id)
