"""When the device ran each batch: the inference process's own record, so the idle gap between two
steps is measured where it happens instead of inferred from the control side.

A ring of the last ``capacity`` batches (0: off, the default; ``--timeline-batches``): each batch's
call type, item count, and start and end on this process's monotonic clock (ns). Recording is an
append of four numbers; reading it (``TimelineRequest``) copies the ring out.
"""

from __future__ import annotations

from collections import deque

from oven.proto import inference as p


class Timeline:
    def __init__(self, capacity: int = 0):
        self.capacity = capacity
        self._batches: deque[tuple[str, int, int, int]] = deque(maxlen=max(capacity, 1))

    def record(self, call_type: str, num_items: int, start_ns: int, end_ns: int) -> None:
        if self.capacity:
            self._batches.append((call_type, num_items, start_ns, end_ns))

    def reply(self, clear: bool) -> p.TimelineReply:
        batches = list(self._batches) if self.capacity else []
        if clear:
            self._batches.clear()
        return p.TimelineReply([b[0] for b in batches], [b[1] for b in batches], [b[2] for b in batches],
                               [b[3] for b in batches], self.capacity)
