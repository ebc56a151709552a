"""When two commands of one queue may share a batch, given their footprints (:mod:`.footprint`).

That depends on how the inference layer executes a batch (see ``inference/engine.py``):

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

from oven.proto import inference as p

from .commands import Command
from .footprint import Embed, HostSlot, KvSlots, Resource, TokenSlot

__all__ = ["KV_WRITTEN_BEFORE_ATTENTION", "QueueFootprint"]

# Call types whose batches write every item's K/V before any item attends.
KV_WRITTEN_BEFORE_ATTENTION = frozenset(p.CODEC.tag(r) for r in (p.ForwardRequest, p.ForwardTextRequest))


class _ResourceSet:
    """Resources taken so far, with an overlap test that understands slot ranges."""

    __slots__ = ("_ids", "_ranges_by_page")

    def __init__(self) -> None:
        self._ids: set[Embed | HostSlot | TokenSlot] = set()
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
