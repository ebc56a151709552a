"""Allocation, freeing and tier moves of KvPages and Embeds, with the exhaustion policy.

* **alloc**: a fresh KvPage still holds its previous owner's K/V, so before the
  handles are handed out every slot is masked (hidden) on the device; a write
  unmasks its slot. An inferlet can therefore never attend over tokens it did
  not write. When the KvPage pool is exhausted, exports whose exporter has
  ended are dropped first (oldest first; see resources/exports.py). When that
  is not enough, or the Embed pool is exhausted, the configured policy decides:
  ``terminate-newest`` kills the newest instances (Pie's FCFS), ``wait`` parks
  the call until memory is freed, ``offload`` moves the pages of instances
  waiting on I/O to the host tier.
* **dealloc**: memory returns to the pool once every call issued before it on
  that queue has completed.
* **offload / restore**: the copy is queued like any call; the handle keeps its
  number, and the bookkeeping moves when the inference layer confirms the copy.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from oven.control.resources import (ExhaustionPolicy, ExportRegistry, InstanceUsage, PhysicalPool, PoolExhausted,
                                    ResourceError, choose_victims)
from oven.control.scheduling import HostSlot, KvSlots
from oven.proto import inference as p
from oven.proto.auth import OPERATOR

from .calls import Submit
from .futures import UNIT, Future
from .instance import Instance, State

log = logging.getLogger(__name__)


@dataclass
class _Parked:
    inst: Instance
    q: int
    kind: str
    count: int
    fut: Future
    since: float


class Allocator:
    """Hands out and takes back an instance's memory; issues the copies that masking and tier moves take.

    ``instances`` is the loop's table of running instances (read here, to choose
    victims); ``kill(inst, reason)`` ends one that the exhaustion policy sacrifices.
    """

    def __init__(self, policy: ExhaustionPolicy, *, kv_pool: PhysicalPool, host_pool: PhysicalPool,
                 exports: ExportRegistry, page_size: int, submit: Submit, instances: Mapping[str, Instance],
                 kill: Callable[[Instance, str], None]):
        self.policy = policy
        self._kv_pool, self._host_pool, self._exports = kv_pool, host_pool, exports
        self._page_size = page_size
        self._submit, self._instances, self._kill = submit, instances, kill
        self._parked: list[_Parked] = []

    # -- alloc / dealloc -------------------------------------------------------

    def allocate(self, inst, q: int, kind: str, count: int, fut: Future) -> None:
        table = inst.resources
        try:
            inst.queue(q)
            handles = table.alloc_kvpages(count) if kind == "kvpages" else table.alloc_embeds(count)
        except ResourceError as exc:
            inst.futures.fail(fut, str(exc))
        except PoolExhausted as exc:
            self._exhausted(inst, q, kind, count, fut, exc)
        else:
            if kind == "kvpages" and handles:
                self._mask_fresh_pages(inst, q, handles, fut)
            else:
                inst.futures.complete(fut, handles)

    def _mask_fresh_pages(self, inst, q: int, handles: list[int], fut: Future) -> None:
        masks = []
        for page_id in inst.resources.physical_pages(handles):
            mask = Future(-1, UNIT)
            self._submit(inst, q, "mask_kvpage", p.MaskKvPageItem(page_id, [True] * self._page_size), mask,
                         writes=frozenset({KvSlots.page(page_id)}))
            masks.append(mask)
        _when_all(masks, lambda error: inst.futures.fail(fut, error) if error else inst.futures.complete(fut, handles))

    def deallocate(self, inst, q: int, kind: str, handles: list[int], fut: Future) -> None:
        def release() -> None:
            try:
                if kind == "kvpages":
                    inst.resources.dealloc_kvpages(handles)
                else:
                    inst.resources.dealloc_embeds(handles)
            except ResourceError as exc:
                inst.futures.fail(fut, str(exc))
                return
            inst.futures.complete(fut)
            self.retry_parked()
        try:
            inst.queue(q).when_drained(release)
        except ValueError as exc:
            inst.futures.fail(fut, str(exc))

    # -- exhaustion ------------------------------------------------------------

    def _exhausted(self, inst, q, kind, count, fut, exc: PoolExhausted) -> None:
        if kind == "kvpages" and self._reclaim_orphaned_exports(exc.requested - exc.available):
            self.allocate(inst, q, kind, count, fut)  # exhausted again only when no orphan is left to drop
            return
        now = time.monotonic()
        usage = [self._usage(i, kind, now) for i in self._instances.values()]
        decision = choose_victims(self.policy, usage, inst.instance_id, exc.requested - exc.available, now,
                                  self._host_pool.num_free)
        if decision.wait:
            inst.blocked_since = now
            self._parked.append(_Parked(inst, q, kind, count, fut, now))
            return
        for victim_id in decision.offload:
            self._offload_all(self._instances[victim_id])
        for victim_id in decision.terminate:
            victim = self._instances.get(victim_id)
            if victim is not None:
                self._kill(victim, f"terminated to free {kind} for an older instance (pool exhausted)")
        if inst.alive and not decision.offload:
            self.allocate(inst, q, kind, count, fut)
        elif inst.alive:
            self._parked.append(_Parked(inst, q, kind, count, fut, now))

    def _reclaim_orphaned_exports(self, needed: int) -> bool:
        """Drop exports whose exporter has ended (a cache) before touching a running instance."""
        dropped = self._exports.reclaim_orphans(needed, self._instances)
        for export in dropped:
            log.info("dropped export %r (%d kvpages, exporter %s ended): the KvPage pool ran out",
                     export.name, len(export.page_ids), export.owner_id)
        return bool(dropped)

    def _usage(self, inst, kind: str, now: float) -> InstanceUsage:
        table = inst.resources
        held = self._exports.num_freed_by_exit(table) if kind == "kvpages" else table.num_embeds
        offloadable = len(table.exclusive_device_handles()) if kind == "kvpages" and inst.io_idle else 0
        return InstanceUsage(inst.instance_id, inst.started_at, held, offloadable,
                             io_wait_since=inst.io_wait_since if inst.io_idle else None,
                             blocked_since=inst.blocked_since)

    def retry_parked(self) -> None:
        parked, self._parked = self._parked, []
        for entry in parked:
            if entry.inst.alive:
                entry.inst.blocked_since = None
                self.allocate(entry.inst, entry.q, entry.kind, entry.count, entry.fut)

    def forget(self, inst) -> None:
        self._parked = [e for e in self._parked if e.inst is not inst]

    def drop_export(self, name: str, *, by: Instance | None = None, namespace: str = OPERATOR) -> None:
        """Release an export: for its exporter ``by`` (``release-export``), or for a client of the
        server, in ``namespace``. Pages it alone held go back to the pool, where a parked allocation
        may now fit.

        Raises ResourceError for an unknown name, or one ``by`` did not export.
        """
        freed = (self._exports.unexport(name, by.instance_id, by.owner) if by
                 else self._exports.drop(name, namespace))
        if freed:
            self.retry_parked()

    # -- tier moves --------------------------------------------------------------

    def move_pages(self, inst, q: int, handles: list[int], direction: str, fut: Future) -> None:
        try:
            inst.queue(q)
            if direction == "offload":
                self._offload(inst, q, handles, fut)
            else:
                self._restore(inst, q, handles, fut)
        except (ResourceError, ValueError) as exc:
            inst.futures.fail(fut, str(exc))
        except PoolExhausted as exc:
            inst.futures.fail(fut, f"cannot {direction}: {exc}")

    def _offload(self, inst, q, handles, fut) -> None:
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
            if error or not inst.alive:
                self._host_pool.release(slot_ids)
                if error:
                    inst.futures.fail(fut, error)
                return
            try:  # the handles may have been freed while the copy ran
                table.mark_offloaded(handles, slot_ids)
            except ResourceError as exc:
                self._host_pool.release(slot_ids)
                inst.futures.fail(fut, str(exc))
                return
            inst.futures.complete(fut)
            self.retry_parked()
        _when_all(copies, done)

    def _restore(self, inst, q, handles, fut) -> None:
        table = inst.resources
        slot_ids = table.host_slots(handles)
        page_ids = self._kv_pool.allocate(len(handles))
        copies = []
        for slot_id, page_id in zip(slot_ids, page_ids):
            copy = Future(-1, UNIT)
            self._submit(inst, q, "restore", p.RestoreItem(slot_id, page_id), copy,
                         reads=frozenset({HostSlot(slot_id)}), writes=frozenset({KvSlots.page(page_id)}))
            copies.append(copy)

        def done(error: str | None) -> None:
            if error or not inst.alive:
                self._kv_pool.release(page_ids)
                if error:
                    inst.futures.fail(fut, error)
                return
            try:
                table.mark_restored(handles, page_ids)
            except ResourceError as exc:
                self._kv_pool.release(page_ids)
                inst.futures.fail(fut, str(exc))
                return
            inst.futures.complete(fut)
        _when_all(copies, done)

    def _offload_all(self, victim) -> None:
        """Swap an I/O-idle victim out; it is swapped back in before its next slice (restore_before_slice)."""
        handles = victim.resources.exclusive_device_handles()
        if not handles or victim.state is State.KILLED:
            return
        victim.swapping = True  # not run while its pages move: they would vanish under its calls
        done = Future(-1, UNIT)

        def offloaded(fut: Future) -> None:
            victim.swapping = False
            if not fut.error:
                victim.swapped_out.extend(handles)
        done.callbacks.append(offloaded)
        self._offload(victim, 0, handles, done)

    def restore_before_slice(self, inst) -> None:
        """Bring back the pages the exhaustion policy swapped out; the instance runs once they are back."""
        handles, inst.swapped_out = inst.swapped_out, []
        inst.swapping = True
        done = Future(-1, UNIT)

        def restored(fut: Future) -> None:
            inst.swapping = False
            if fut.error:
                self._kill(inst, f"its swapped-out KV pages could not be restored: {fut.error}")
        done.callbacks.append(restored)
        self.move_pages(inst, 0, handles, "restore", done)


def _when_all(futures: list[Future], then) -> None:
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

