"""KvPage moves off the device and back: to the host tier and back (copies), or discarded and given
fresh pages (InferCept's discard: the inferlet rewrites them), with the bookkeeping after them.

A copy is queued like any call, ordered after the calls that wrote its page; the
handle keeps its number, and the table changes only when the inference layer
confirms the copy (so a page is never reused while a copy still reads it). A
discard needs no copy: the caller makes sure no call of the instance is queued
or in flight, so its pages go back to the pool at once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from oven.control.resources.pool import PhysicalPool
from oven.control.resources.slab import ResourceError
from oven.control.resources.table import DISCARDED, HOST
from oven.control.scheduling.footprint import HostSlot, KvSlots
from oven.proto import inference as p

from .calls import Submit
from .futures import UNIT, Future
from .instance import Instance


class TierMoves:
    """``on_freed()`` runs whenever an offload gave device pages back (after a :meth:`discard`, the
    caller decides when)."""

    def __init__(self, *, kv_pool: PhysicalPool, host_pool: PhysicalPool, submit: Submit, page_size: int,
                 on_freed: Callable[[], None]):
        self._kv_pool, self._host_pool, self._submit, self._on_freed = kv_pool, host_pool, submit, on_freed
        self._page_size = page_size
        # Device pages restores are copying into, by instance: in no table until the copy lands (see num_arriving).
        self._num_arriving_by_instance_id: Counter = Counter()

    def num_arriving(self, inst: Instance) -> int:
        """Device pages taken for ``inst``'s restores in flight: the exhaustion policy must count them
        as held by it (they are in its table once the copies land), as it does a blank page."""
        return self._num_arriving_by_instance_id[inst.instance_id]

    def mask_fresh(self, inst: Instance, q: int, page_ids: list[int]) -> list[Future]:
        """Hide every slot of freshly allocated pages (they still hold their previous owner's K/V; a
        write unmasks its slot); the futures of the masks."""
        masks = []
        for page_id in page_ids:
            mask = Future(-1, UNIT)
            self._submit(inst, q, "mask_kvpage", p.MaskKvPageItem(page_id, [True] * self._page_size), mask,
                         writes=frozenset({KvSlots.page(page_id)}))
            masks.append(mask)
        return masks

    def offload(self, inst: Instance, q: int, handles: list[int], fut: Future) -> None:
        """Copy device pages to fresh host slots; raises ResourceError / PoolExhausted before any copy."""
        table = inst.resources
        page_ids = table.physical_pages(handles)  # raises for a handle already on the host
        slot_ids = self._host_pool.allocate(len(handles))
        copies = []
        for page_id, slot_id in zip(page_ids, slot_ids):
            copy = Future(-1, UNIT)
            self._submit(inst, q, "offload", p.OffloadItem(page_id, slot_id), copy,
                         reads=frozenset({KvSlots.page(page_id)}), writes=frozenset({HostSlot(slot_id)}))
            copies.append(copy)

        def done(error: str | None) -> None:
            if self._settle(inst, fut, error, slot_ids, self._host_pool,
                            lambda: table.mark_offloaded(handles, slot_ids)):
                self._on_freed()
        when_all(copies, done)

    def restore(self, inst: Instance, q: int, handles: list[int], fut: Future) -> None:
        """Copy host slots back to fresh device pages; raises ResourceError / PoolExhausted before any copy."""
        table = inst.resources
        slot_ids = table.host_slots(handles)
        page_ids = self._kv_pool.allocate(len(handles))
        copies = []
        for slot_id, page_id in zip(slot_ids, page_ids):
            copy = Future(-1, UNIT)
            self._submit(inst, q, "restore", p.RestoreItem(slot_id, page_id), copy,
                         reads=frozenset({HostSlot(slot_id)}), writes=frozenset({KvSlots.page(page_id)}))
            copies.append(copy)
        arriving = self._num_arriving_by_instance_id
        arriving[inst.instance_id] += len(page_ids)

        def done(error: str | None) -> None:
            arriving[inst.instance_id] -= len(page_ids)
            if not arriving[inst.instance_id]:
                del arriving[inst.instance_id]
            self._settle(inst, fut, error, page_ids, self._kv_pool, lambda: table.mark_restored(handles, page_ids))
        when_all(copies, done)

    def blank(self, inst: Instance, q: int, handles: list[int], fut: Future) -> None:
        """Fresh masked device pages for discarded handles; raises PoolExhausted before any call."""
        page_ids = self._kv_pool.allocate(len(handles))
        # The table holds them at once, unlike a restore's pages (whose handles name the host slot until
        # the copy lands): a blank page is refused to forwards anyway, and the exhaustion policy must
        # count it as this instance's while its masks are in flight.
        inst.resources.mark_blank(handles, page_ids)
        when_all(self.mask_fresh(inst, q, page_ids),
                 lambda error: inst.futures.fail(fut, error) if error else inst.futures.complete(fut))

    @staticmethod
    def _settle(inst, fut: Future, error: str | None, new_ids: list[int], pool: PhysicalPool, mark) -> bool:
        """Record a finished copy (``mark``), or give the destination ids back; whether it was recorded."""
        if error or not inst.alive:
            pool.release(new_ids)
            if error:
                inst.futures.fail(fut, error)
            return False
        try:  # the handles may have been freed while the copy ran
            mark()
        except ResourceError as exc:
            pool.release(new_ids)
            inst.futures.fail(fut, str(exc))
            return False
        inst.futures.complete(fut)
        return True

    def swap_out(self, victim: Instance) -> None:
        """Move every page only ``victim`` holds to the host tier; it does not run until they are back
        (``Allocator.swap_in``)."""
        handles = victim.resources.exclusive_device_handles()
        if not handles or not victim.alive:
            return
        victim.swapping = True  # not run while its pages move: they would vanish under its calls
        done = Future(-1, UNIT)

        def offloaded(fut: Future) -> None:
            victim.swapping = False
            if not fut.error:
                victim.swapped_out.extend(handles)
        done.callbacks.append(offloaded)
        self.offload(victim, 0, handles, done)

    def discard(self, victim: Instance) -> int:
        """Free the device pages of ``victim``'s discardable handles (``ResourceTable.discardable_handles``);
        the caller made sure none of its calls is queued or in flight. It does not run until they have
        fresh pages (:meth:`swap_in`), which its inferlet rewrites. How many pages were freed."""
        handles = victim.resources.discardable_handles()
        if not handles or not victim.alive:
            return 0
        victim.resources.mark_discarded(handles)
        victim.swapped_out.extend(handles)
        return len(handles)

    def swap_in(self, inst: Instance, on_error: Callable[[str], None]) -> None:
        """Bring back what :meth:`swap_out` moved and give :meth:`discard`ed handles fresh pages; the
        caller checked that the device pool has room for both."""
        handles, inst.swapped_out = inst.swapped_out, []
        inst.swapping = True
        on_host = [h for h in handles if inst.resources.location(h) == HOST]
        discarded = [h for h in handles if inst.resources.location(h) == DISCARDED]
        moves = []
        for move, moved in ((self.restore, on_host), (self.blank, discarded)):
            if moved:
                moves.append(Future(-1, UNIT))
                move(inst, 0, moved, moves[-1])

        def back(error: str | None) -> None:
            inst.swapping = False
            if error:
                on_error(error)
        when_all(moves, back)


def when_all(futures: list[Future], then) -> None:
    """Call ``then(first error or None)`` once every future has settled."""
    remaining = [len(futures)]
    errors: list[str] = []

    def settled(fut: Future) -> None:
        if fut.error:
            errors.append(fut.error)
        remaining[0] -= 1
        if remaining[0] == 0:
            then(errors[0] if errors else None)
    for fut in futures:
        fut.callbacks.append(settled)
    if not futures:
        then(None)
