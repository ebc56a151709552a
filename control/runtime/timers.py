"""Deadlines for ``sleep`` futures, fired by the control loop."""

from __future__ import annotations

import heapq
import itertools
from typing import Callable


class Timers:
    def __init__(self):
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()

    def add(self, deadline: float, fire: Callable[[], None]) -> None:
        heapq.heappush(self._heap, (deadline, next(self._order), fire))

    def next_deadline(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def fire_due(self, now: float) -> int:
        fired = 0
        while self._heap and self._heap[0][0] <= now:
            heapq.heappop(self._heap)[2]()
            fired += 1
        return fired
