"""The token future slots of one inference connection, from the control side: which ids are in use.

The inference process keeps what a sampling item drew in the slot the control process named
(proto/inference.py, "Token futures"); this side hands out the ids. A slot is in use while a
command that samples into it, or reads it, has not settled: a reader sent before its producer's
reply finds the token there. Once the producer has settled, later readers get the token itself
(the control process knows it by then), so the slot is free again as soon as the commands that
were issued in the meantime have settled. Ids are reused lowest first, so the inference
process's table stays as small as the most slots ever in use at once.
"""

from __future__ import annotations

import heapq


class TokenSlots:
    def __init__(self) -> None:
        self._refs: dict[int, int] = {}
        self._free: list[int] = []  # a heap of released ids below _next_id
        self._next_id = 0

    def __len__(self) -> int:
        """Slots in use."""
        return len(self._refs)

    @property
    def high_water(self) -> int:
        """The most slots ever in use at once: the size of the inference process's table."""
        return self._next_id

    def allocate(self) -> int:
        """A slot no command uses, held once (by the command that will sample into it)."""
        if self._free:
            slot = heapq.heappop(self._free)
        else:
            slot, self._next_id = self._next_id, self._next_id + 1
        self._refs[slot] = 1
        return slot

    def hold(self, slot: int) -> None:
        """One more command uses ``slot`` (KeyError for a slot not in use)."""
        self._refs[slot] += 1

    def release(self, slot: int) -> None:
        """A command that used ``slot`` has settled; the last one frees it (KeyError for a slot not in use)."""
        refs = self._refs[slot] - 1
        if refs:
            self._refs[slot] = refs
        else:
            del self._refs[slot]
            heapq.heappush(self._free, slot)

    def reset(self) -> None:
        """A new inference process: it holds no slot, and the commands that held one are forgotten."""
        self.__init__()
