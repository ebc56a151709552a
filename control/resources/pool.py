"""A physical pool: which of the ids ``0..size-1`` of one kind are free, and how many holders each has.

One pool per kind — KvPages, Embeds, host-tier slots — mirrors the inference
layer's memory, which is addressed by these ids and never decides who owns
what. Reference counts let one page be held by several holders (an exporter,
its export, every importer); the id returns to the free list only when the last
holder releases it.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable

from .slab import ResourceError


class PoolExhausted(RuntimeError):
    """Not enough free ids of ``kind``: a matter for the exhaustion policy, not the inferlet's fault."""

    def __init__(self, kind: str, requested: int, available: int):
        super().__init__(f"{kind} pool exhausted: {requested} requested, {available} free")
        self.kind = kind
        self.requested = requested
        self.available = available


class PhysicalPool:
    """Free list and reference counts for physical ids ``0..size-1``.

    Freed ids go to the back of the free list, so a just-freed page is the last
    to be reused: a late write through a stale physical id lands on a page that
    is most likely still free, and such bugs show up in tests instead of
    corrupting a neighbour.
    """

    def __init__(self, kind: str, size: int):
        if size < 0:
            raise ValueError(f"{kind} pool size must be >= 0, got {size}")
        self.kind = kind
        self.size = size
        self._free_ids: deque[int] = deque(range(size))
        self._refcount_by_id = [0] * size

    @property
    def num_free(self) -> int:
        return len(self._free_ids)

    @property
    def num_used(self) -> int:
        return self.size - len(self._free_ids)

    def refcount(self, physical_id: int) -> int:
        """Holders of ``physical_id``; 0 when free."""
        self._check_range(physical_id)
        return self._refcount_by_id[physical_id]

    def allocate(self, n: int) -> list[int]:
        """``n`` free ids, each with one reference; all or nothing.

        Raises PoolExhausted (with ``requested`` and ``available``) when fewer
        than ``n`` are free, and ValueError for a negative ``n``.
        """
        if n < 0:
            raise ValueError(f"cannot allocate {n} {self.kind} ids")
        if n > len(self._free_ids):
            raise PoolExhausted(self.kind, n, len(self._free_ids))
        ids = [self._free_ids.popleft() for _ in range(n)]
        for physical_id in ids:
            self._refcount_by_id[physical_id] = 1
        return ids

    def retain(self, ids: Iterable[int]) -> None:
        """One more reference on each id (repeats count twice); every id must be allocated."""
        ids = list(ids)
        for physical_id in ids:
            if self.refcount(physical_id) == 0:
                raise ResourceError(f"cannot share {self.kind} {physical_id}: it is free")
        for physical_id in ids:
            self._refcount_by_id[physical_id] += 1

    def release(self, ids: Iterable[int]) -> list[int]:
        """Drop one reference per occurrence; return the ids that became free, in order.

        All or nothing: releasing more references than an id has (a double
        free) raises ResourceError and changes nothing.
        """
        count_by_id = Counter(ids)
        for physical_id, count in count_by_id.items():
            held = self.refcount(physical_id)
            if count > held:
                raise ResourceError(
                    f"double free of {self.kind} {physical_id}: releasing {count} references, it has {held}"
                )
        freed_ids = []
        for physical_id, count in count_by_id.items():
            self._refcount_by_id[physical_id] -= count
            if self._refcount_by_id[physical_id] == 0:
                self._free_ids.append(physical_id)
                freed_ids.append(physical_id)
        return freed_ids

    def _check_range(self, physical_id: int) -> None:
        if isinstance(physical_id, bool) or not isinstance(physical_id, int) or not 0 <= physical_id < self.size:
            raise ResourceError(f"{self.kind} {physical_id!r} is not a physical id (0..{self.size - 1})")
