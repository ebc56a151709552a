"""The interrupt manager: completions queue up in the order they arrive and are injected at the
next token boundary outside a critical section, as ``[INTR] id [HEAD] value [END]``."""

from __future__ import annotations

import inferlet


class Interrupts:
    def __init__(self):
        self.queued: list[tuple[str, str]] = []  # (id, value) in arrival order
        self._arrival: inferlet.Future | None = None

    def push(self, call_id: str, value: str) -> None:
        self.queued.append((call_id, value))
        if self._arrival is not None and not self._arrival.done():
            self._arrival.set_result(None)

    def take(self) -> list[tuple[str, str]]:
        queued, self.queued = self.queued, []
        return queued

    async def arrival(self, new: bool = False) -> None:
        """Wait until an interrupt is queued (``new``: until one more arrives)."""
        if new or not self.queued:
            self._arrival = inferlet.Future()
            await self._arrival
