"""What a command reads and writes, and when two commands of one queue may share a batch.

A command names the memory it touches as *resources*: token-slot ranges of a
KvPage (:class:`KvSlots`, which also covers the page's mask bits), Embed slots
(:class:`Embed`) and host-tier slots (:class:`HostSlot`). All ids are physical.
KvPage footprints are ranges rather than one key per token so that a 512-token
prefill costs a handful of keys, not 512.

Whether two commands of one queue may run in the same batch depends on how the
inference layer executes a batch (see ``inference/engine.py``):

* ``forward`` / ``forward_text`` write the K/V of *every* item, layer by layer,
  before any item attends. A later forward reading slots an earlier one writes
  is therefore fine (this is what makes a prompt split into chunks batchable),
  but a later forward *writing* slots an earlier one reads is not: the earlier
  one would see the new values. Input embeds are gathered before any output
  embed is stored, so reading an embed an earlier forward writes is not fine.
* every other call type gathers its inputs before it scatters its outputs (or
  runs items in order, which is stricter), so a later command must not read or
  write what an earlier one writes.
* two commands writing the same slot always conflict: which one wins would
  depend on the kernel.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .commands import Command

__all__ = [
    "KvSlots",
    "Embed",
    "HostSlot",
    "Resource",
    "KV_WRITTEN_BEFORE_ATTENTION",
    "forward_kv_footprint",
    "QueueFootprint",
]

# Larger than any page size: the stop of a range meaning "to the end of the page".
PAGE_END = 2**31 - 1

# Call types whose batches write every item's K/V before any item attends.
KV_WRITTEN_BEFORE_ATTENTION = frozenset({"forward", "forward_text"})


@dataclass(frozen=True, slots=True)
class KvSlots:
    """Token slots ``[start, stop)`` of KvPage ``page_id`` (K, V and mask bits)."""

    page_id: int
    start: int = 0
    stop: int = PAGE_END

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.stop:
            raise ValueError(f"empty or negative slot range [{self.start}, {self.stop}) of page {self.page_id}")

    @classmethod
    def page(cls, page_id: int) -> KvSlots:
        """Every slot of the page: what mask, offload and restore touch."""
        return cls(page_id)


@dataclass(frozen=True, slots=True)
class Embed:
    embed_id: int


@dataclass(frozen=True, slots=True)
class HostSlot:
    host_slot_id: int


Resource = KvSlots | Embed | HostSlot


def forward_kv_footprint(kv_page_ids: list[int], kv_last_page_len: int, num_inputs: int,
                         page_size: int) -> tuple[frozenset[KvSlots], frozenset[KvSlots]]:
    """(reads, writes) of a forward over a paged context, in the conventions of ``proto/inference.py``.

    The context holds ``(len(kv_page_ids) - 1) * page_size + kv_last_page_len``
    tokens; the inputs are its last ``num_inputs`` and are written there; every
    slot of the context may be read. Naming the last page's valid slots exactly
    (not the whole page) is what lets the next chunk of the same prompt, which
    writes the rest of that page, join the same batch.
    """
    if not kv_page_ids or not 1 <= kv_last_page_len <= page_size:
        raise ValueError("a context needs at least one page and 1 <= kv_last_page_len <= page_size")
    num_tokens = (len(kv_page_ids) - 1) * page_size + kv_last_page_len
    if not 1 <= num_inputs <= num_tokens:
        raise ValueError(f"{num_inputs} inputs do not fit a context of {num_tokens} tokens")
    return (frozenset(_ranges(kv_page_ids, 0, num_tokens, page_size)),
            frozenset(_ranges(kv_page_ids, num_tokens - num_inputs, num_tokens, page_size)))


def _ranges(kv_page_ids: list[int], first: int, stop: int, page_size: int) -> Iterable[KvSlots]:
    """Per-page slot ranges covering context positions ``[first, stop)``."""
    for index in range(first // page_size, (stop + page_size - 1) // page_size):
        base = index * page_size
        yield KvSlots(kv_page_ids[index], max(first, base) - base, min(stop, base + page_size) - base)


class _ResourceSet:
    """Resources taken so far, with an overlap test that understands slot ranges."""

    __slots__ = ("_ids", "_ranges_by_page")

    def __init__(self) -> None:
        self._ids: set[Embed | HostSlot] = set()
        self._ranges_by_page: dict[int, list[tuple[int, int]]] = {}

    def add(self, resources: Iterable[Resource]) -> None:
        for r in resources:
            if isinstance(r, KvSlots):
                self._ranges_by_page.setdefault(r.page_id, []).append((r.start, r.stop))
            else:
                self._ids.add(r)

    def overlaps(self, resources: Iterable[Resource]) -> bool:
        for r in resources:
            if isinstance(r, KvSlots):
                if any(start < r.stop and r.start < stop for start, stop in self._ranges_by_page.get(r.page_id, ())):
                    return True
            elif r in self._ids:
                return True
        return False


class QueueFootprint:
    """The commands already taken from one queue into the batch being formed."""

    __slots__ = ("_kv_reads", "_writes")

    def __init__(self) -> None:
        self._writes = _ResourceSet()
        self._kv_reads = _ResourceSet()  # only forwards need these (write-after-read)

    def add(self, command: Command) -> None:
        self._add(command.call_type, *command.footprint())

    def admit(self, command: Command) -> bool:
        """Add ``command`` (the queue's next one) unless it conflicts; see the module docstring."""
        reads, writes = command.footprint()
        if self._writes.overlaps(writes):
            return False
        if command.call_type in KV_WRITTEN_BEFORE_ATTENTION:
            other_reads = [r for r in reads if not isinstance(r, KvSlots)]
            if self._writes.overlaps(other_reads) or self._kv_reads.overlaps(writes):
                return False
        elif self._writes.overlaps(reads):
            return False
        self._add(command.call_type, reads, writes)
        return True

    def _add(self, call_type: str, reads: frozenset[Resource], writes: frozenset[Resource]) -> None:
        self._writes.add(writes)
        if call_type in KV_WRITTEN_BEFORE_ATTENTION:
            self._kv_reads.add(r for r in reads if isinstance(r, KvSlots))
