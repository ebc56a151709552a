"""Allocation and freeing of KvPages and Embeds, with the exhaustion policy and the queue of waiters.

* **alloc**: a fresh KvPage still holds its previous owner's K/V, so before the
  handles are handed out every slot is masked (hidden) on the device; a write
  unmasks its slot. An inferlet can therefore never attend over tokens it did
  not write. When the KvPage pool is exhausted, exports whose exporter has
  ended are dropped first (oldest first; see resources/exports.py). When that
  is not enough, or the Embed pool is exhausted, the configured policy decides
  (resources/exhaustion.py): swap instances out to the host tier, park the
  call, or kill.
* **waiters**: parked allocations, and swapped-out or discarded instances due to
  run again (their pages come back first: runtime/tiers.py), wait in one queue
  ordered by the instance's arrival. Under ``preempt`` it is strict FCFS: only
  its head is retried, a newer instance's allocation queues behind an older
  waiter, and no new instance starts while anyone waits, so the
  instances admitted are those whose pages fit, and a preempted one resumes
  before anyone who arrived after it. Between clients the pool is shared fairly
  (resources/exhaustion.py, FairShares): a waiter whose client would hold more
  than its share with what it asks for queues behind those whose clients would
  not, whatever their arrival, and does not stop new instances from starting.
* **dealloc**: memory returns to the pool once every call issued before it on
  that queue has completed.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from oven.control.resources.exhaustion import (ExhaustionPolicy, FairShares, InstanceUsage, choose_victims,
                                               held_by_client)
from oven.control.resources.exports import ExportRegistry
from oven.control.resources.pool import PhysicalPool, PoolExhausted
from oven.control.resources.slab import ResourceError
from oven.proto.auth import OPERATOR

from .calls import Submit
from .futures import Future
from .instance import Instance
from .tiers import TierMoves, when_all

log = logging.getLogger(__name__)


@dataclass(eq=False)
class _Waiter:
    """An instance waiting for device memory: an allocation (``fut``), its swapped-out or discarded
    pages, or both."""

    inst: Instance
    q: int = 0
    kind: str = "kvpages"
    count: int = 0
    fut: Future | None = None
    arrival: tuple[float, int] = field(init=False)
    over_share: bool = field(init=False, default=False)  # its client would hold more than its fair share

    def __post_init__(self):
        self.arrival = (self.inst.started_at, self.inst.sequence)

    @property
    def turn(self) -> tuple[bool, tuple[float, int]]:
        """Its place in the queue: those within their clients' shares first, each by arrival."""
        return self.over_share, self.arrival

    @property
    def num_kvpages(self) -> int:
        """Device pages it needs: its swapped-out and discarded ones and what it asks for."""
        return len(self.inst.swapped_out) + (self.count if self.kind == "kvpages" else 0)


class Allocator:
    """Hands out and takes back an instance's memory; issues the copies that masking and tier moves take.

    ``instances`` is the loop's table of running instances (read here, to choose
    victims); ``kill(inst, reason)`` ends one that the exhaustion policy sacrifices;
    ``has_calls(inst)`` says whether calls of ``inst`` are queued or in flight (its
    pages cannot move under them).
    """

    def __init__(self, policy: ExhaustionPolicy, *, kv_pool: PhysicalPool, host_pool: PhysicalPool,
                 exports: ExportRegistry, page_size: int, submit: Submit, instances: Mapping[str, Instance],
                 kill: Callable[[Instance, str], None], has_calls: Callable[[Instance], bool]):
        self.policy = policy
        self._kv_pool, self._host_pool, self._exports = kv_pool, host_pool, exports
        self._submit, self._instances, self._kill, self._has_calls = submit, instances, kill, has_calls
        self.tiers = TierMoves(kv_pool=kv_pool, host_pool=host_pool, submit=submit, page_size=page_size,
                               on_freed=self.retry_parked)
        self._waiters: list[_Waiter] = []  # by arrival
        self._retried: list[_Waiter] = []  # while _retry_once goes through them: waiters not yet back in the queue
        self._waiting_ids: set[str] = set()  # their instances: the loop asks about each instance every turn
        self._retrying = self._retry_again = False
        self.num_preempted = 0  # instances swapped out to answer an exhausted pool

    # -- alloc / dealloc -------------------------------------------------------

    def allocate(self, inst, q: int, kind: str, count: int, fut: Future) -> None:
        try:
            inst.queue(q)
        except ValueError as exc:
            inst.futures.fail(fut, str(exc))
            return
        waiter = _Waiter(inst, q, kind, count, fut)
        if kind == "kvpages" and self._behind_a_waiter(waiter):
            self._park(waiter)
        else:
            self._try(waiter)

    def _try(self, waiter: _Waiter) -> None:
        inst, fut = waiter.inst, waiter.fut
        table = inst.resources
        try:
            alloc = table.alloc_kvpages if waiter.kind == "kvpages" else table.alloc_embeds
            handles = alloc(waiter.count)
        except ResourceError as exc:
            inst.futures.fail(fut, str(exc))
        except PoolExhausted as exc:
            if waiter.kind == "kvpages" and self._reclaim_orphaned_exports(exc.requested - exc.available):
                self._try(waiter)  # exhausted again only when no orphan is left to drop
            else:
                self._exhausted(waiter, exc.requested - exc.available)
        else:
            if waiter.kind == "kvpages" and handles:
                self._mask_fresh_pages(inst, waiter.q, handles, fut)
            else:
                inst.futures.complete(fut, handles)

    def _mask_fresh_pages(self, inst, q: int, handles: list[int], fut: Future) -> None:
        masks = self.tiers.mask_fresh(inst, q, inst.resources.physical_pages(handles))
        when_all(masks, lambda error: inst.futures.fail(fut, error) if error else inst.futures.complete(fut, handles))

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

    def move_pages(self, inst, q: int, handles: list[int], direction: str, fut: Future) -> None:
        """An inferlet's own offload / restore of its pages."""
        try:
            inst.queue(q)
            move = self.tiers.offload if direction == "offload" else self.tiers.restore
            move(inst, q, handles, fut)
        except (ResourceError, ValueError) as exc:
            inst.futures.fail(fut, str(exc))
        except PoolExhausted as exc:
            inst.futures.fail(fut, f"cannot {direction}: {exc}")

    # -- exhaustion ------------------------------------------------------------

    def _exhausted(self, waiter: _Waiter, needed: int) -> None:
        inst = waiter.inst
        now = time.monotonic()
        usage = [self._usage(i, waiter.kind, now) for i in self._instances.values()]
        shares = self._shares(usage, waiter) if waiter.kind == "kvpages" and self.policy.fcfs else None
        decision = choose_victims(self.policy, usage, inst.instance_id, needed, now, self._host_pool.num_free,
                                  shares=shares, requested=waiter.num_kvpages)
        if decision.wait:
            self._park(waiter)
            return
        for victim_id in decision.terminate:  # first: what they hold on the host makes room for the swaps
            if (victim := self._instances.get(victim_id)) is not None:
                if decision.over_share:
                    reason = (f"terminated: its client {victim.owner!r} held {shares.held[victim.owner]} of the "
                              f"{self._kv_pool.size} KvPages, more than its fair share of {shares.share}, while "
                              f"client {inst.owner!r} waited for pages, and the host tier had no room for its pages")
                else:
                    reason = f"terminated to free {waiter.kind} for an older instance (pool exhausted)"
                self._kill(victim, reason)
        for victim_id in decision.offload:
            if (victim := self._instances.get(victim_id)) is not None:
                self.tiers.swap_out(victim)
                self.num_preempted += 1
        if not inst.alive:
            return
        if decision.offload:
            self._park(waiter)  # retried when the copies have freed the pages
        else:
            self._resume(waiter)

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
        movable = kind == "kvpages" and not inst.swapping and not self._has_calls(inst)
        offloadable = len(table.exclusive_device_handles()) if movable else 0
        # An instance whose pages are on their way to the host is about to free them: not blocked.
        return InstanceUsage(inst.instance_id, inst.started_at, held, offloadable,
                             num_arriving=self.tiers.num_arriving(inst) if kind == "kvpages" else 0,
                             io_wait_since=inst.io_wait_since if inst.io_idle else None,
                             blocked_since=None if inst.swapping else inst.blocked_since,
                             client=inst.owner, num_on_host=table.num_offloaded if kind == "kvpages" else 0)

    def _shares(self, usage: list[InstanceUsage] | None, *newcomers: _Waiter) -> FairShares | None:
        """The clients' shares of the KvPage pool, from the instances' kvpage ``usage`` (made here if None),
        the waiters' clients and ``newcomers``' wanting pages too; sets each one's ``over_share``. None, and
        nobody over, while every instance is one client's."""
        waiters = [w for w in (*self._waiters, *self._retried, *newcomers) if w.kind == "kvpages"]
        if len({inst.owner for inst in self._instances.values()}) < 2:
            for waiter in waiters:
                waiter.over_share = False
            return None
        if usage is None:
            now = time.monotonic()
            usage = [self._usage(inst, "kvpages", now) for inst in self._instances.values()]
        shares = FairShares.of(self._kv_pool.size, held_by_client(usage), {w.inst.owner for w in waiters})
        for waiter in waiters:
            waiter.over_share = shares.over(waiter.inst.owner, waiter.num_kvpages)
        return shares

    # -- waiters -----------------------------------------------------------------

    def _park(self, waiter: _Waiter) -> None:
        waiter.inst.blocked_since = waiter.inst.blocked_since or time.monotonic()
        bisect.insort(self._waiters, waiter, key=lambda w: w.arrival)
        self._waiting_ids.add(waiter.inst.instance_id)

    def _behind_a_waiter(self, waiter: _Waiter) -> bool:
        """Under FCFS, whether a parked waiter comes before ``waiter`` (see _Waiter.turn)."""
        if not (self.policy.fcfs and self._waiters):
            return False
        self._shares(None, waiter)
        return min(w.turn for w in self._waiters) < waiter.turn

    def is_waiting(self, inst) -> bool:
        return inst.instance_id in self._waiting_ids

    @property
    def admitting(self) -> bool:
        """Whether a new instance may start: under FCFS, not while anyone waits for memory within its
        client's share (a client over its share waits for its own instances, not others)."""
        return not (self.policy.fcfs and any(not w.over_share for w in self._waiters))

    @property
    def num_waiting(self) -> int:
        return len(self._waiters)

    def swap_in(self, inst) -> None:
        """Bring back the pages ``inst`` was swapped out of before its next slice; if they do not fit
        now, or an older instance waits, it waits its turn."""
        if not self.is_waiting(inst):
            waiter = _Waiter(inst)
            if self._behind_a_waiter(waiter):
                self._park(waiter)
            else:
                self._resume(waiter)

    def _resume(self, waiter: _Waiter) -> None:
        """Swap the waiter's pages in and retry its allocation if both fit; else decide again."""
        inst = waiter.inst
        inst.blocked_since = None
        if inst.swapped_out:
            short = waiter.num_kvpages - self._kv_pool.num_free
            if short > 0 and self._reclaim_orphaned_exports(short):
                short = waiter.num_kvpages - self._kv_pool.num_free
            if short > 0:
                self._exhausted(waiter, short)
                return
            self.tiers.swap_in(inst, lambda error: self._kill(inst, f"its swapped-out KV pages could not be "
                                                                    f"restored: {error}"))
        if waiter.fut is not None:
            self._try(waiter)

    def retry_parked(self) -> None:
        """Memory came back (or the picture changed): retry the waiters, oldest first."""
        if self._retrying:  # a kill or a copy during a retry: go round once more
            self._retry_again = True
            return
        self._retrying = True
        try:
            self._retry_again = True
            while self._retry_again:
                self._retry_again = False
                self._retry_once()
        finally:
            self._retrying = False

    def _retry_once(self) -> None:
        pending, self._waiters = self._waiters, []
        self._waiting_ids.clear()  # _park puts back those that still wait
        if self.policy.fcfs and pending:
            self._retried = pending
            self._shares(None)
            pending.sort(key=lambda w: w.turn)
        try:
            for index, waiter in enumerate(pending):
                self._retried = pending[index + 1:]
                if not waiter.inst.alive:
                    continue
                if waiter.inst.swapping:  # retried when its copies complete
                    self._park(waiter)
                    continue
                self._resume(waiter)
                if self.policy.fcfs and waiter in self._waiters:  # the first still waits: nobody after overtakes it
                    for rest in pending[index + 1:]:
                        if rest.inst.alive:
                            self._park(rest)
                    return
        finally:
            self._retried = []

    def forget(self, inst) -> None:
        self._waiters = [w for w in self._waiters if w.inst is not inst]
        self._waiting_ids.discard(inst.instance_id)

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

    def drop_snapshot(self, name: str, namespace: str) -> None:
        """``drop-snapshot``: any inferlet of client ``namespace`` drops its snapshot ``name``; the pages
        no reader holds go back to the pool. ResourceError if the client has no such snapshot."""
        if self._exports.drop_snapshot(name, namespace):
            self.retry_parked()
