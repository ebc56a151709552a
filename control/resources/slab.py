"""Virtual handles: the u32 names an inferlet uses for its KvPages and Embeds.

A slab never reissues a handle number in its lifetime (a monotonic counter), so
a stale handle — freed, with its number later handed to a new resource — can
never silently alias that resource: it is always rejected, and the error can
say "already freed" rather than guess. 0 is never issued, so an inferlet may
use 0 to mean "none". Four billion allocations per instance and kind are
plenty; running past ``U32_MAX`` raises instead of wrapping around.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Generic, TypeVar

U32_MAX = 2**32 - 1

V = TypeVar("V")


class ResourceError(ValueError):
    """An inferlet named a resource it does not hold, or asked for something malformed.

    The runtime reports it to the inferlet (or traps it). It never means the
    system ran out of memory: that is :class:`PoolExhausted`, deliberately not a
    subclass, so that ``except ResourceError`` cannot swallow contention that the
    exhaustion policy must handle.
    """


class HandleSlab(Generic[V]):
    """Handles ``first_handle, first_handle + 1, ...`` mapped to values of one kind.

    ``kind`` ("kvpage", "embed") only names the handles in error messages.
    Iteration order is issue order.
    """

    def __init__(self, kind: str, first_handle: int = 1):
        if not 1 <= first_handle <= U32_MAX:
            raise ValueError(f"first_handle must be in 1..{U32_MAX}, got {first_handle}")
        self.kind = kind
        self._first_handle = first_handle
        self._next_handle = first_handle
        self._value_by_handle: dict[int, V] = {}

    def __len__(self) -> int:
        return len(self._value_by_handle)

    def __contains__(self, handle: object) -> bool:
        return _is_int(handle) and handle in self._value_by_handle

    def __iter__(self) -> Iterator[int]:
        return iter(list(self._value_by_handle))

    def items(self) -> list[tuple[int, V]]:
        return list(self._value_by_handle.items())

    def insert(self, value: V) -> int:
        """Store ``value`` under a never-used handle and return it.

        Raises ResourceError once ``U32_MAX`` has been issued.
        """
        if self._next_handle > U32_MAX:
            raise ResourceError(f"{self.kind} handle space exhausted: this inferlet was issued every u32 handle")
        handle = self._next_handle
        self._next_handle += 1
        self._value_by_handle[handle] = value
        return handle

    def get(self, handle: int) -> V:
        """The value of a live handle; ResourceError for a freed, forged or malformed one."""
        value = self._value_by_handle.get(handle, _MISSING) if type(handle) is int else _MISSING
        if value is _MISSING:  # bool is an int subclass but not `int`: True never means handle 1
            raise self._unknown(handle)
        return value

    def set(self, handle: int, value: V) -> None:
        """Rebind a live handle (the handle the inferlet holds stays the same)."""
        self.check([handle])
        self._value_by_handle[handle] = value

    def remove(self, handle: int) -> V:
        self.check([handle])
        return self._value_by_handle.pop(handle)

    def check(self, handles: Iterable[int]) -> None:
        """Raise ResourceError unless every handle is live and none repeats.

        Callers validate a whole batch with this before changing anything, so a
        call that names one bad handle fails without side effects. A repeat is
        rejected because freeing ``[h, h]`` is a double free.
        """
        seen: set[int] = set()
        for handle in handles:
            if not (_is_int(handle) and handle in self._value_by_handle):
                raise self._unknown(handle)
            if handle in seen:
                raise ResourceError(f"{self.kind} handle {handle} appears twice in one call")
            seen.add(handle)

    def _unknown(self, handle: object) -> ResourceError:
        if not _is_int(handle) or not 0 <= handle <= U32_MAX:
            return ResourceError(f"{self.kind} handle {handle!r} is not a u32 handle")
        if self._first_handle <= handle < self._next_handle:
            return ResourceError(
                f"{self.kind} handle {handle} is not owned by this inferlet: it was already freed "
                "(use after free or double free)"
            )
        return ResourceError(f"{self.kind} handle {handle} is not owned by this inferlet: it was never allocated here")


_MISSING = object()


def _is_int(value: object) -> bool:
    # bool is an int subclass; True must not quietly mean handle 1.
    return isinstance(value, int) and not isinstance(value, bool)
