"""An inferlet's view of one command queue: its scheduler queue and the futures still open on it.

``when_drained`` runs a callback once every future issued on the queue so far
has completed: ``synchronize`` and the deferred frees of ``dealloc-*`` use it,
so memory is never returned while a call that uses it is still queued.
"""

from __future__ import annotations

from typing import Callable

from .futures import Future


class QueueState:
    def __init__(self, scheduler_queue_id: int):
        self.scheduler_queue_id = scheduler_queue_id
        self._open: set[int] = set()  # handles of futures issued here and not completed
        self._waiters: list[tuple[frozenset[int], Callable[[], None]]] = []

    def track(self, fut: Future) -> None:
        self._open.add(fut.handle)
        fut.callbacks.append(self._completed)

    def when_drained(self, callback: Callable[[], None]) -> None:
        if not self._open:
            callback()
        else:
            self._waiters.append((frozenset(self._open), callback))

    def _completed(self, fut: Future) -> None:
        self._open.discard(fut.handle)
        still_waiting = []
        for handles, callback in self._waiters:
            if handles & self._open:
                still_waiting.append((handles, callback))
            else:
                callback()
        self._waiters = still_waiting
