"""Deadlines for ``sleep`` futures, fired by the control loop."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Hashable
from typing import Callable


class Timers:
    def __init__(self):
        self._heap: list[tuple[float, int, Hashable, Callable[[], None]]] = []
        self._order = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, deadline: float, fire: Callable[[], None], owner: Hashable = None) -> None:
        heapq.heappush(self._heap, (deadline, next(self._order), owner, fire))

    def forget(self, owner: Hashable) -> None:
        """Drop ``owner``'s timers (an instance that ended): a far deadline would otherwise keep its
        closure, and through it the instance, for as long as the server runs."""
        kept = [timer for timer in self._heap if timer[2] != owner]
        if len(kept) != len(self._heap):
            heapq.heapify(kept)
            self._heap = kept

    def next_deadline(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def fire_due(self, now: float) -> int:
        fired = 0
        while self._heap and self._heap[0][0] <= now:
            heapq.heappop(self._heap)[3]()
            fired += 1
        return fired
