"""Resource bookkeeping: handle slabs, physical pools, per-instance tables, exports, exhaustion policy."""

from __future__ import annotations

import dataclasses
import functools
import subprocess
import sys

import pytest

from oven.control.resources import exports as exports_module
from oven.control.resources.exhaustion import (Decision, ExhaustionPolicy, FairShares, InstanceUsage, choose_victims,
                                               held_by_client)
from oven.control.resources.exports import MAX_NAME_BYTES, ExportRegistry
from oven.control.resources.pool import PhysicalPool, PoolExhausted
from oven.control.resources.slab import U32_MAX, HandleSlab, ResourceError
from oven.control.resources.table import DEVICE, HOST, QuotaExceeded, ResourceTable

NUM_KV_PAGES, NUM_EMBEDS, NUM_HOST_SLOTS = 8, 16, 4


class Pools:
    def __init__(self):
        self.kv = PhysicalPool("kvpage", NUM_KV_PAGES)
        self.embed = PhysicalPool("embed", NUM_EMBEDS)
        self.host = PhysicalPool("host slot", NUM_HOST_SLOTS)
        self.exports = ExportRegistry(self.kv)

    def table(self, instance_id=1, **quotas) -> ResourceTable:
        return ResourceTable(instance_id, self.kv, self.embed, self.host, **quotas)

    def assert_all_free(self):
        assert (self.kv.num_free, self.embed.num_free, self.host.num_free) == (NUM_KV_PAGES, NUM_EMBEDS, NUM_HOST_SLOTS)


@pytest.fixture
def pools() -> Pools:
    return Pools()


def test_package_does_not_import_torch():
    code = "import sys, oven.control.resources; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


# -- HandleSlab -------------------------------------------------------------------


def test_slab_issues_nonzero_handles_and_never_reuses_a_number():
    slab = HandleSlab("kvpage")
    first = [slab.insert(v) for v in "abc"]
    assert first == [1, 2, 3]
    assert slab.remove(2) == "b"
    assert slab.insert("d") == 4  # 2 stays dead forever
    assert list(slab) == [1, 3, 4] and slab.items() == [(1, "a"), (3, "c"), (4, "d")]
    assert 2 not in slab and 0 not in slab


def test_slab_tells_freed_from_never_allocated():
    slab = HandleSlab("kvpage")
    handle = slab.insert("a")
    slab.remove(handle)
    with pytest.raises(ResourceError, match=r"kvpage handle 1 is not owned by this inferlet: it was already freed"):
        slab.get(handle)
    with pytest.raises(ResourceError, match=r"kvpage handle 17 is not owned by this inferlet: it was never allocated"):
        slab.get(17)


@pytest.mark.parametrize("forged", [0, -1, U32_MAX + 1, True, "1", 1.0, None])
def test_slab_rejects_forged_handles(forged):
    slab = HandleSlab("embed")
    slab.insert("a")  # handle 1 is live: True and 1.0 must still not reach it
    with pytest.raises(ResourceError, match="embed handle"):
        slab.get(forged)
    assert forged not in slab


def test_slab_raises_past_u32_instead_of_wrapping():
    slab = HandleSlab("kvpage", first_handle=U32_MAX)
    assert slab.insert("last") == U32_MAX
    with pytest.raises(ResourceError, match="handle space exhausted"):
        slab.insert("one too many")
    with pytest.raises(ValueError, match="first_handle must be in 1..4294967295, got 0"):
        HandleSlab("kvpage", first_handle=0)


def test_slab_check_rejects_repeats_and_is_a_value_error():
    slab = HandleSlab("kvpage")
    handle = slab.insert("a")
    with pytest.raises(ResourceError, match="appears twice"):
        slab.check([handle, handle])
    assert issubclass(ResourceError, ValueError)


# -- PhysicalPool -------------------------------------------------------------------


def test_pool_allocates_in_order_and_reuses_freed_ids_last():
    pool = PhysicalPool("kvpage", 4)
    assert pool.allocate(2) == [0, 1]
    assert pool.release([0]) == [0]
    assert pool.allocate(3) == [2, 3, 0]
    assert (pool.num_free, pool.num_used) == (0, 4)


def test_pool_exhaustion_carries_counts_and_allocates_nothing():
    pool = PhysicalPool("kvpage", 4)
    pool.allocate(3)
    with pytest.raises(PoolExhausted, match="kvpage pool exhausted: 5 requested, 1 free") as info:
        pool.allocate(5)
    assert (info.value.kind, info.value.requested, info.value.available) == ("kvpage", 5, 1)
    assert not isinstance(info.value, ResourceError)
    assert pool.num_free == 1
    assert pool.allocate(0) == []
    with pytest.raises(ValueError, match="cannot allocate -1 kvpage ids"):
        pool.allocate(-1)


def test_pool_refcounts_free_only_at_last_release():
    pool = PhysicalPool("kvpage", 4)
    [page] = pool.allocate(1)
    pool.retain([page, page])
    assert pool.refcount(page) == 3
    assert pool.release([page, page]) == []
    assert pool.num_used == 1
    assert pool.release([page]) == [page]
    assert pool.refcount(page) == 0 and pool.num_free == 4


def test_pool_double_free_is_atomic():
    pool = PhysicalPool("kvpage", 4)
    a, b = pool.allocate(2)
    with pytest.raises(ResourceError, match="double free of kvpage 1: releasing 2 references, it has 1"):
        pool.release([a, b, b])
    assert pool.refcount(a) == pool.refcount(b) == 1  # a was not released either
    pool.release([a])
    with pytest.raises(ResourceError, match="double free of kvpage 0"):
        pool.release([a])


def test_pool_rejects_out_of_range_and_sharing_free_ids():
    pool = PhysicalPool("kvpage", 4)
    with pytest.raises(ResourceError, match="not a physical id"):
        pool.release([4])
    with pytest.raises(ResourceError, match="it is free"):
        pool.retain([0])


# -- ResourceTable: mapping, ownership, quotas --------------------------------------


def test_table_maps_virtual_handles_to_physical_ids(pools):
    pools.kv.allocate(2)  # someone else holds pages 0 and 1
    table = pools.table()
    pages = table.alloc_kvpages(3)
    embeds = table.alloc_embeds(2)
    assert pages == [1, 2, 3] and embeds == [1, 2]  # separate handle spaces, each from 1
    assert table.physical_pages(pages) == [2, 3, 4]
    assert table.physical_pages([pages[2], pages[0], pages[2]]) == [4, 2, 4]  # lookups may repeat
    assert table.physical_embeds(embeds) == [0, 1]
    assert [table.location(h) for h in pages] == [DEVICE] * 3
    assert (table.num_kvpages, table.num_embeds) == (3, 2)


def test_foreign_handles_are_unknown(pools):
    alice, bob = pools.table(1), pools.table(2)
    alice.alloc_kvpages(1)
    bob_pages = bob.alloc_kvpages(3)
    with pytest.raises(ResourceError, match="kvpage handle 3 is not owned by this inferlet: it was never allocated"):
        alice.physical_pages([bob_pages[2]])
    with pytest.raises(ResourceError, match="kvpage handle 3 is not owned by this inferlet: it was never allocated here"):
        alice.dealloc_kvpages([bob_pages[2]])
    assert bob.physical_pages(bob_pages) == [1, 2, 3]


def test_use_after_free_and_double_free(pools):
    table = pools.table()
    a, b = table.alloc_kvpages(2)
    table.dealloc_kvpages([a])
    assert pools.kv.num_free == NUM_KV_PAGES - 1
    for call in (table.physical_pages, table.dealloc_kvpages):
        with pytest.raises(ResourceError, match="already freed"):
            call([a])
    with pytest.raises(ResourceError, match="appears twice"):
        table.dealloc_kvpages([b, b])
    with pytest.raises(ResourceError, match="already freed"):
        table.dealloc_kvpages([b, a])  # one bad handle: b is not freed either
    assert table.physical_pages([b]) == [1]
    [e] = table.alloc_embeds(1)
    table.dealloc_embeds([e])
    with pytest.raises(ResourceError, match="embed handle 1 .* already freed"):
        table.dealloc_embeds([e])
    assert pools.embed.num_free == NUM_EMBEDS


def test_quota_is_checked_before_the_pool_and_allocates_nothing(pools):
    table = pools.table(max_kvpages=3, max_embeds=2)
    table.alloc_kvpages(2)
    with pytest.raises(QuotaExceeded, match="kvpage quota exceeded: holding 2, asked for 2 more, quota is 3") as info:
        table.alloc_kvpages(2)
    assert (info.value.kind, info.value.requested, info.value.held, info.value.quota) == ("kvpage", 2, 2, 3)
    assert isinstance(info.value, ResourceError)
    with pytest.raises(QuotaExceeded, match="embed quota exceeded: holding 0, asked for 100 more, quota is 2"):
        table.alloc_embeds(100)  # over quota and over the pool: quota wins
    assert table.num_kvpages == 2 and pools.kv.num_used == 2 and pools.embed.num_used == 0
    table.alloc_kvpages(1)  # exactly at the quota is fine


def test_pool_exhaustion_leaves_the_table_unchanged(pools):
    pools.kv.allocate(3)  # someone else's
    table = pools.table()
    table.alloc_kvpages(3)
    with pytest.raises(PoolExhausted, match="kvpage pool exhausted: 3 requested, 2 free") as info:
        table.alloc_kvpages(3)
    assert (info.value.requested, info.value.available) == (3, 2)
    assert table.num_kvpages == 3 and pools.kv.num_free == 2
    assert table.alloc_kvpages(2) == [4, 5]


def test_an_allocation_past_the_pools_size_is_over_quota_whatever_the_quota(pools):
    """An instance never holds more KvPages than the pool has (``--max-kv-pages-per-instance`` defaults
    far above a small pool's size): what could never fit fails at once, not by exhausting the pool."""
    for quotas in ({}, {"max_kvpages": 4096}):
        table = pools.table(**quotas)
        table.alloc_kvpages(NUM_KV_PAGES - 1)
        with pytest.raises(QuotaExceeded, match=f"holding {NUM_KV_PAGES - 1}, asked for 2 more, quota is "
                                                f"{NUM_KV_PAGES}"):
            table.alloc_kvpages(2)
        table.alloc_kvpages(1)  # the whole pool is fine
        table.release_all()


@pytest.mark.parametrize("n", [-1, True, 1.5, "2"])
def test_bad_counts_are_rejected(pools, n):
    with pytest.raises(ResourceError, match="cannot allocate"):
        pools.table().alloc_kvpages(n)


def test_release_all_returns_everything_and_closes(pools):
    table = pools.table()
    pages = table.alloc_kvpages(5)
    table.alloc_embeds(7)
    [slot] = pools.host.allocate(1)
    table.mark_offloaded(pages[:1], [slot])
    table.release_all()
    pools.assert_all_free()
    assert (table.num_kvpages, table.num_embeds, table.closed) == (0, 0, True)
    with pytest.raises(ResourceError, match="already freed"):
        table.physical_pages(pages[1:2])
    with pytest.raises(ResourceError, match="has exited"):
        table.alloc_kvpages(1)
    table.release_all()  # a kill racing an exit is harmless
    pools.assert_all_free()


# -- ResourceTable: host tier ------------------------------------------------------


def test_offload_keeps_the_handle_and_moves_ownership_to_the_host_pool(pools):
    table = pools.table()
    a, b, c = table.alloc_kvpages(3)
    slots = pools.host.allocate(2)
    table.mark_offloaded([a, c], slots)
    assert [table.location(h) for h in (a, b, c)] == [HOST, DEVICE, HOST]
    assert table.host_slots([c, a]) == [slots[1], slots[0]]
    assert pools.kv.num_used == 1 and pools.host.num_used == 2
    assert table.kvpage_handles(HOST) == [a, c] and table.num_offloaded == 2
    with pytest.raises(ResourceError, match="kvpage handle 1 is offloaded to the host tier; restore it first"):
        table.physical_pages([a])
    with pytest.raises(ResourceError, match="on the device, not offloaded"):
        table.host_slots([b])

    new_pages = pools.kv.allocate(2)
    table.mark_restored([c, a], new_pages)
    assert table.physical_pages([a, b, c]) == [new_pages[1], 1, new_pages[0]]
    assert pools.kv.num_used == 3 and pools.host.num_used == 0
    table.dealloc_kvpages([a, b, c])
    pools.assert_all_free()


def test_dealloc_of_an_offloaded_page_frees_its_host_slot(pools):
    table = pools.table()
    [h] = table.alloc_kvpages(1)
    table.mark_offloaded([h], pools.host.allocate(1))
    table.dealloc_kvpages([h])
    pools.assert_all_free()


def test_offload_and_restore_reject_bad_moves_and_change_nothing(pools):
    table = pools.table()
    a, b = table.alloc_kvpages(2)
    slots = pools.host.allocate(2)
    with pytest.raises(ResourceError, match="2 kvpage handles but 1 destination ids"):
        table.mark_offloaded([a, b], slots[:1])
    with pytest.raises(ResourceError, match="repeat"):
        table.mark_offloaded([a, b], [slots[0], slots[0]])
    with pytest.raises(ResourceError, match=r"host slot 3 must be freshly allocated by the caller \(has 0 references"):
        table.mark_offloaded([a], [3])  # a free slot the caller does not own
    with pytest.raises(ResourceError, match="kvpage handle 1 is on the device already"):
        table.mark_restored([a], pools.kv.allocate(1))
    assert table.kvpage_handles(DEVICE) == [a, b] and pools.host.num_used == 2
    table.mark_offloaded([a], slots[:1])
    with pytest.raises(ResourceError, match="kvpage handle 1 is on the host already"):
        table.mark_offloaded([a], slots[1:])
    table.dealloc_kvpages([b])
    with pytest.raises(ResourceError, match="kvpage handle 2 .* already freed"):
        table.mark_offloaded([b], slots[1:])
    assert pools.host.refcount(slots[1]) == 1  # still the caller's


def test_offload_needs_a_host_tier(pools):
    table = ResourceTable(1, pools.kv, pools.embed)
    [h] = table.alloc_kvpages(1)
    with pytest.raises(ResourceError, match="no host tier"):
        table.mark_offloaded([h], [0])


def test_a_late_offload_ack_after_a_kill_is_refused(pools):
    table = pools.table()
    [h] = table.alloc_kvpages(1)
    slots = pools.host.allocate(1)  # the runtime sent an offload, then killed the instance
    table.release_all()
    with pytest.raises(ResourceError, match=r"kvpage handle 1 is not owned by this inferlet: it was already freed"):
        table.mark_offloaded([h], slots)
    pools.host.release(slots)  # the caller still owns the slot after a refused move
    pools.assert_all_free()


# -- ExportRegistry -----------------------------------------------------------------


def test_exported_pages_survive_the_exporter_until_the_last_holder_lets_go(pools):
    exporter, importer = pools.table(1), pools.table(2)
    pages = exporter.alloc_kvpages(3)
    physical = exporter.physical_pages(pages)
    pools.exports.export_kvpages(exporter, "sysprompt", pages)
    assert [pools.kv.refcount(p) for p in physical] == [2, 2, 2]

    exporter.release_all()  # exporter exits: the export keeps the pages
    assert pools.kv.num_used == 3
    imported = pools.exports.import_kvpages(importer, "sysprompt")
    assert imported == [1, 2, 3] and importer.physical_pages(imported) == physical

    pools.exports.drop("sysprompt")  # export gone: the importer still holds them
    assert pools.kv.num_used == 3 and "sysprompt" not in pools.exports
    importer.dealloc_kvpages(imported[:1])
    assert pools.kv.num_used == 2
    importer.release_all()
    pools.assert_all_free()


def test_each_import_takes_its_own_references(pools):
    exporter, importer = pools.table(1), pools.table(2)
    [page] = exporter.alloc_kvpages(1)
    pools.exports.export_kvpages(exporter, "p", [page])
    first = pools.exports.import_kvpages(importer, "p")
    second = pools.exports.import_kvpages(importer, "p")
    assert first != second and importer.physical_pages(first + second) == [0, 0]
    assert pools.kv.refcount(0) == 4
    pools.exports.unexport("p", 1)
    exporter.dealloc_kvpages([page])
    importer.dealloc_kvpages(first)
    assert pools.kv.refcount(0) == 1
    importer.dealloc_kvpages(second)
    pools.assert_all_free()


def test_export_errors_change_nothing(pools):
    owner = pools.table(1, max_kvpages=10)
    a, b = owner.alloc_kvpages(2)
    pools.exports.export_kvpages(owner, "x", [a])
    with pytest.raises(ResourceError, match="export name 'x' is taken"):
        pools.exports.export_kvpages(owner, "x", [b])
    with pytest.raises(ResourceError, match="names a kvpage handle twice"):
        pools.exports.export_kvpages(owner, "y", [b, b])
    with pytest.raises(ResourceError, match="already freed|never allocated"):
        pools.exports.export_kvpages(owner, "y", [b, 42])
    owner.mark_offloaded([b], pools.host.allocate(1))
    with pytest.raises(ResourceError, match="offloaded"):
        pools.exports.export_kvpages(owner, "y", [b])
    for bad_name in ("", "n" * (MAX_NAME_BYTES + 1), 7):
        with pytest.raises(ResourceError, match="export name"):
            pools.exports.export_kvpages(owner, bad_name, [a])
    with pytest.raises(ResourceError, match="export 'y' names no kvpage"):  # it would cost nothing to hoard
        pools.exports.export_kvpages(owner, "y", [])
    assert pools.exports.list_exports() == [("x", 1)]
    assert pools.kv.refcount(0) == 2  # only the owner and "x"


def test_a_client_holds_at_most_max_exports_per_client(pools, monkeypatch):
    """Exports outlive their exporter, so a client's are bounded in number (many names on one page
    cost no KV); another client's are not affected, and releasing one makes room."""
    monkeypatch.setattr(exports_module, "MAX_EXPORTS_PER_CLIENT", 3)
    owner = pools.table(1)
    (page,) = owner.alloc_kvpages(1)
    for name in ("a", "b", "c"):
        pools.exports.export_kvpages(owner, name, [page], namespace="mallory")
    with pytest.raises(ResourceError, match="this client has 3 exports already: release some first"):
        pools.exports.export_kvpages(owner, "d", [page], namespace="mallory")
    pools.exports.export_kvpages(owner, "d", [page], namespace="alice")
    pools.exports.drop("a", "mallory")
    pools.exports.export_kvpages(owner, "d", [page], namespace="mallory")
    assert len(pools.exports) == 4


def test_import_errors(pools):
    owner, importer = pools.table(1), pools.table(2, max_kvpages=2)
    pools.exports.export_kvpages(owner, "three", owner.alloc_kvpages(3))
    with pytest.raises(ResourceError, match="no kvpage export named 'missing'"):
        pools.exports.import_kvpages(importer, "missing")
    with pytest.raises(QuotaExceeded, match="kvpage quota exceeded: holding 0, asked for 3 more, quota is 2"):
        pools.exports.import_kvpages(importer, "three")
    assert importer.num_kvpages == 0 and pools.kv.refcount(0) == 2


def test_orphans_are_reclaimed_oldest_first_and_only_for_pages_they_free(pools):
    """Exports of ended exporters go first in, first out, until enough pages came free."""
    ended = [pools.table(i) for i in (1, 2, 3)]
    running, importer = pools.table(4), pools.table(5)
    for table, name, n in zip(ended, ("old", "imported", "new"), (2, 1, 2)):
        pools.exports.export_kvpages(table, name, table.alloc_kvpages(n))
        table.release_all()
    pools.exports.export_kvpages(running, "live", running.alloc_kvpages(1))
    held = pools.exports.import_kvpages(importer, "imported")  # its one page lives on in the importer
    alive = {4, 5}

    assert [e.name for e in pools.exports.reclaim_orphans(1, alive)] == ["old"]
    assert pools.kv.num_used == 4 and "old" not in pools.exports
    # "imported" would free nothing: kept (still importable); "live" has a running exporter.
    assert [e.name for e in pools.exports.reclaim_orphans(10, alive)] == ["new"]
    assert pools.exports.list_exports() == [("imported", 1), ("live", 1)]
    assert pools.exports.reclaim_orphans(10, alive) == []
    importer.dealloc_kvpages(held)
    assert [e.name for e in pools.exports.reclaim_orphans(1, alive)] == ["imported"]
    assert pools.exports.reclaim_orphans(1, {5}) == []  # "live": an orphan now, but its exporter holds the page
    running.release_all()
    assert [e.name for e in pools.exports.reclaim_orphans(1, {5})] == ["live"]
    pools.assert_all_free()


def test_a_page_two_orphans_share_frees_with_the_second(pools):
    owner = pools.table(1)
    a, b = owner.alloc_kvpages(2)
    pools.exports.export_kvpages(owner, "first", [a, b])
    pools.exports.export_kvpages(owner, "second", [b])
    owner.release_all()
    # "first" frees page a; page b needs both dropped, so asking for 2 drops both.
    assert [e.name for e in pools.exports.reclaim_orphans(1, set())] == ["first"]
    assert pools.kv.num_used == 1
    assert [e.name for e in pools.exports.reclaim_orphans(1, set())] == ["second"]
    pools.assert_all_free()


def test_only_the_exporter_may_unexport_but_the_runtime_may_drop(pools):
    owner, other = pools.table(1), pools.table(2)
    pools.exports.export_kvpages(owner, "a", owner.alloc_kvpages(1))
    pools.exports.export_kvpages(owner, "b", owner.alloc_kvpages(1))
    pools.exports.export_kvpages(other, "c", other.alloc_kvpages(1))
    with pytest.raises(ResourceError, match="only its exporter may release it"):
        pools.exports.unexport("a", other.instance_id)
    assert [e.name for e in pools.exports.exported_by(1)] == ["a", "b"]
    assert pools.exports.list_exports() == [("a", 1), ("b", 1), ("c", 1)]
    pools.exports.unexport("a", 1)
    owner.release_all()
    other.release_all()
    for name in [e.name for e in pools.exports.exported_by(1)] + ["c"]:  # orphans, reclaimed by the runtime
        pools.exports.drop(name)
    assert len(pools.exports) == 0
    pools.assert_all_free()


def test_registry_refuses_a_table_over_another_pool(pools):
    stranger = ResourceTable(9, PhysicalPool("kvpage", 2), pools.embed)
    with pytest.raises(ValueError, match="different KvPage pools"):
        pools.exports.export_kvpages(stranger, "s", stranger.alloc_kvpages(1))


# -- exclusive pages: what an exit or an offload would actually free -------------------


def test_exclusive_device_handles_exclude_shared_and_offloaded_pages(pools):
    owner, importer = pools.table(1), pools.table(2)
    a, b, c = owner.alloc_kvpages(3)
    pools.exports.export_kvpages(owner, "b", [b])
    owner.mark_offloaded([c], pools.host.allocate(1))
    assert owner.exclusive_device_handles() == [a]
    assert pools.exports.num_freed_by_exit(owner) == 2  # a, and b with the export that goes with it
    twice = pools.exports.import_kvpages(importer, "b") + pools.exports.import_kvpages(importer, "b")
    assert importer.exclusive_device_handles() == [] and pools.exports.num_freed_by_exit(importer) == 0
    assert pools.exports.num_freed_by_exit(owner) == 1  # page b lives on in the importer
    pools.exports.drop("b")
    owner.dealloc_kvpages([b])
    # the importer alone holds page b, through two handles: exiting would free it
    assert importer.exclusive_device_handles() == twice and pools.exports.num_freed_by_exit(importer) == 1


# -- exhaustion policy ----------------------------------------------------------------


def usage(instance_id, started_at, num_reclaimable, **kw) -> InstanceUsage:
    return InstanceUsage(instance_id, started_at, num_reclaimable, **kw)


FLEET = [usage("old", 0.0, 4), usage("mid", 1.0, 3), usage("empty", 2.0, 0), usage("new", 3.0, 2)]


def test_policy_names_and_validation():
    assert ExhaustionPolicy("terminate-newest") == ExhaustionPolicy.terminate_newest()
    assert ExhaustionPolicy.wait(5.0).max_wait_s == 5.0
    assert ExhaustionPolicy.offload().name == "offload"
    assert ExhaustionPolicy.preempt().fcfs and not ExhaustionPolicy.wait().fcfs
    with pytest.raises(ValueError, match="unknown exhaustion policy"):
        ExhaustionPolicy("lifo")
    with pytest.raises(ValueError, match="max_wait_s"):
        ExhaustionPolicy("offload", 1.0)


def test_terminate_newest_kills_newest_holders_until_enough():
    policy = ExhaustionPolicy.terminate_newest()
    assert choose_victims(policy, FLEET, "old", 1, now=9.0) == Decision(terminate=("new",))
    assert choose_victims(policy, FLEET, "old", 3, now=9.0) == Decision(terminate=("new", "mid"))  # skips "empty"
    assert choose_victims(policy, FLEET, "old", 5, now=9.0) == Decision(terminate=("new", "mid"))


def test_terminate_newest_sacrifices_the_requester_when_newer_ones_cannot_cover():
    policy = ExhaustionPolicy.terminate_newest()
    assert choose_victims(policy, FLEET, "new", 1, now=9.0) == Decision(terminate=("new",))
    assert choose_victims(policy, FLEET, "mid", 3, now=9.0) == Decision(terminate=("mid",))  # "new" frees only 2
    assert choose_victims(policy, FLEET, "old", 6, now=9.0) == Decision(terminate=("old",))


def test_terminate_newest_breaks_start_time_ties_by_list_order():
    tied = [usage("a", 1.0, 2), usage("b", 1.0, 2), usage("c", 1.0, 2)]
    assert choose_victims(ExhaustionPolicy.terminate_newest(), tied, "a", 2, now=0.0).terminate == ("c",)
    assert choose_victims(ExhaustionPolicy.terminate_newest(), tied, "c", 2, now=0.0).terminate == ("c",)


def test_wait_parks_while_a_running_holder_can_free_enough():
    policy = ExhaustionPolicy.wait(max_wait_s=10.0)
    assert choose_victims(policy, FLEET, "old", 3, now=0.0) == Decision(wait=True)
    blocked = [usage("old", 0.0, 4, blocked_since=1.0), usage("new", 3.0, 2, blocked_since=4.0)]
    # every holder is itself parked on an allocation: waiting would deadlock
    assert choose_victims(policy, blocked, "old", 1, now=5.0) == Decision(terminate=("new",))


def test_wait_gives_up_after_max_wait_or_when_nobody_could_free_enough():
    policy = ExhaustionPolicy.wait(max_wait_s=10.0)
    parked = [usage("old", 0.0, 4, blocked_since=1.0), *FLEET[1:]]
    assert choose_victims(policy, parked, "old", 1, now=10.9).wait
    assert choose_victims(policy, parked, "old", 1, now=11.0) == Decision(terminate=("new",))
    assert choose_victims(policy, FLEET, "old", 6, now=0.0) == Decision(terminate=("old",))  # others hold only 5
    assert choose_victims(ExhaustionPolicy.wait(), parked, "old", 1, now=1e9).wait  # no deadline


def test_offload_moves_io_waiting_instances_with_the_most_wasted_memory_time():
    fleet = [
        usage("runner", 0.0, 4, num_offloadable=4),
        usage("short-pause", 1.0, 3, num_offloadable=3, io_wait_since=9.0),  # waste 3
        usage("long-pause", 2.0, 4, num_offloadable=4, io_wait_since=5.0),  # waste 20
        usage("req", 3.0, 1),
    ]
    policy = ExhaustionPolicy.offload()
    assert choose_victims(policy, fleet, "req", 2, now=10.0, num_free_host_slots=8) == Decision(offload=("long-pause",))
    assert choose_victims(policy, fleet, "req", 6, now=10.0, num_free_host_slots=8).offload == (
        "long-pause", "short-pause")
    # the biggest waster does not fit in the host tier; the next one does
    assert choose_victims(policy, fleet, "req", 2, now=10.0, num_free_host_slots=3).offload == ("short-pause",)


def test_offload_falls_back_to_terminate_newest():
    fleet = [usage("paused", 0.0, 2, num_offloadable=2, io_wait_since=0.0), usage("new", 5.0, 3), usage("req", 4.0, 1)]
    policy = ExhaustionPolicy.offload()
    assert choose_victims(policy, fleet, "req", 3, now=9.0, num_free_host_slots=8) == Decision(terminate=("new",))
    assert choose_victims(policy, fleet, "req", 2, now=9.0, num_free_host_slots=1) == Decision(terminate=("new",))
    requester_paused = [usage("req", 0.0, 5, num_offloadable=5, io_wait_since=0.0)]
    assert choose_victims(policy, requester_paused, "req", 1, now=9.0, num_free_host_slots=8).terminate == ("req",)


def test_preempt_swaps_out_io_waiters_first_then_the_newest_newer_than_the_requester():
    fleet = [
        usage("req", 0.0, 2, num_offloadable=2),
        usage("paused", 1.0, 3, num_offloadable=3, io_wait_since=5.0),
        usage("mid", 2.0, 2, num_offloadable=2),
        usage("busy", 3.0, 2),  # its calls are in flight: nothing to move now
        usage("new", 4.0, 2, num_offloadable=2),
    ]
    policy = ExhaustionPolicy.preempt()
    assert choose_victims(policy, fleet, "req", 3, now=9.0, num_free_host_slots=8) == Decision(offload=("paused",))
    assert choose_victims(policy, fleet, "req", 5, now=9.0, num_free_host_slots=8) == Decision(
        offload=("paused", "new"))
    # "paused" does not fit in 2 host slots; the newest does
    assert choose_victims(policy, fleet, "req", 2, now=9.0, num_free_host_slots=2) == Decision(offload=("new",))
    # an older instance is never preempted for a newer one: "mid" only waits ("busy" can still free)
    assert choose_victims(policy, fleet, "mid", 4, now=9.0, num_free_host_slots=2) == Decision(wait=True)


def test_preempt_waits_while_pages_can_come_back_and_kills_only_when_nothing_can():
    policy = ExhaustionPolicy.preempt()
    parked = [usage("old", 0.0, 3, blocked_since=1.0), usage("req", 1.0, 2, num_offloadable=2, blocked_since=2.0)]
    # the older parked instance will swap the requester out: it waits
    assert choose_victims(policy, parked, "req", 1, now=3.0, num_free_host_slots=2) == Decision(wait=True)
    # the host tier is full and every holder is parked: a deadlock no swap can break
    assert choose_victims(policy, parked, "req", 1, now=3.0, num_free_host_slots=1) == Decision(terminate=("req",))
    assert choose_victims(policy, parked, "old", 1, now=3.0, num_free_host_slots=1) == Decision(terminate=("req",))
    # it needs more than everyone else holds: it can never fit
    assert choose_victims(policy, FLEET, "old", 6, now=0.0, num_free_host_slots=99) == Decision(terminate=("old",))


def test_preempt_waits_for_pages_arriving_from_the_host_tier():
    # Measured in bench/infercept.py: the requester ("e") comes back from a tool call with 4 pages on
    # the host and finds 2 free; the other 46 are being restored for four instances (copies in flight,
    # in no table yet: nothing reclaimable, nothing offloadable), the rest are swapped out or empty.
    # They run on once their pages land: the requester waits, with 949 host slots free.
    fleet = [
        usage("5", 0.0, 0, num_arriving=32),
        usage("7", 5.5, 0, io_wait_since=11.3),
        usage("a", 7.0, 0, num_arriving=5),
        usage("b", 8.7, 0, io_wait_since=11.3),
        usage("c", 9.5, 0, num_arriving=4),
        usage("d", 9.8, 0, num_arriving=5),
        usage("e", 10.6, 0),
        usage("f", 10.7, 0, blocked_since=11.4),
        usage("10", 11.2, 0),
    ]
    policy = ExhaustionPolicy.preempt()
    assert choose_victims(policy, fleet, "e", 2, now=11.5, num_free_host_slots=949) == Decision(wait=True)
    # a long agent (36 pages on the host) needs 9 more than are free: one holder's restore is in
    # flight, the others' pages are on their way to the host
    fleet = [usage("7", 0.0, 0), usage("11", 7.3, 0, io_wait_since=11.0), usage("13", 10.9, 0, num_arriving=7),
             usage("14", 11.0, 7), usage("15", 11.0, 1)]
    assert choose_victims(policy, fleet, "7", 9, now=11.5, num_free_host_slots=969) == Decision(wait=True)
    assert choose_victims(ExhaustionPolicy.wait(), fleet, "7", 9, now=11.5) == Decision(wait=True)
    # more than everyone else holds or receives: it can never fit
    assert choose_victims(policy, fleet, "7", 16, now=11.5, num_free_host_slots=969) == Decision(terminate=("7",))


def test_preempt_kills_the_newest_in_a_deadlock_no_swap_can_break():
    # every holder is parked on an allocation, nothing is arriving, and no holder newer than the
    # requester (nor the requester itself) fits in the host tier
    fleet = [usage("old", 0.0, 2, num_offloadable=2, blocked_since=1.0),
             usage("mid", 1.0, 3, num_offloadable=3, blocked_since=2.0),
             usage("new", 2.0, 4, num_offloadable=4, blocked_since=3.0)]
    policy = ExhaustionPolicy.preempt()
    assert choose_victims(policy, fleet, "old", 3, now=4.0, num_free_host_slots=1) == Decision(terminate=("new",))
    # with the host slots for the newest, it is swapped out instead
    assert choose_victims(policy, fleet, "old", 3, now=4.0, num_free_host_slots=4) == Decision(offload=("new",))


def test_choose_victims_rejects_bad_arguments():
    with pytest.raises(ValueError, match="not among the instances"):
        choose_victims(ExhaustionPolicy.terminate_newest(), FLEET, "ghost", 1, now=0.0)
    with pytest.raises(ValueError, match="needed must be >= 1"):
        choose_victims(ExhaustionPolicy.terminate_newest(), FLEET, "old", 0, now=0.0)


def test_terminate_newest_on_real_tables_lets_the_oldest_allocate(pools):
    tables = {iid: pools.table(iid) for iid in ("old", "new")}
    tables["old"].alloc_kvpages(3)
    tables["new"].alloc_kvpages(5)
    with pytest.raises(PoolExhausted, match="kvpage pool exhausted: 4 requested, 0 free") as info:
        tables["old"].alloc_kvpages(4)
    fleet = [usage(iid, t, pools.exports.num_freed_by_exit(tables[iid])) for t, iid in enumerate(tables)]
    needed = info.value.requested - info.value.available
    decision = choose_victims(ExhaustionPolicy.terminate_newest(), fleet, "old", needed, now=0.0)
    for iid in decision.terminate:
        tables[iid].release_all()
    assert decision.terminate == ("new",)
    assert tables["old"].alloc_kvpages(4) == [4, 5, 6, 7]


# -- fair shares between clients (preempt) ----------------------------------------------


def test_fair_shares_split_the_pool_between_the_clients_that_hold_or_want_pages():
    fleet = [usage("a1", 0.0, 2, num_arriving=1, client="a"), usage("a2", 1.0, 3, client="a"),
             usage("b1", 2.0, 0, client="b"), usage("c1", 3.0, 0, client="c")]
    assert held_by_client(fleet) == {"a": 6, "b": 0, "c": 0}
    shares = FairShares.of(5, held_by_client(fleet), wanting={"b"})  # c neither holds nor wants pages
    assert (shares.share, shares.floor, shares.held, shares.contended) == (3, 2, {"a": 6, "b": 0}, True)
    assert shares.over("a") and not shares.over("b", 3) and shares.over("b", 4)
    assert (shares.above("a"), shares.above("b")) == (4, 0)  # taken from down to the floor at most
    alone = FairShares.of(5, {"a": 6}, wanting={"a"})
    assert (alone.share, alone.contended, alone.over("a", 10)) == (5, False, False)


# Client a's three instances hold the whole pool of 5 and the 8 host slots and wait on I/O (timers, say);
# client b's newcomer asks for 3 pages: half the pool, rounded up, its share.
HOARD = [usage("a1", 0.0, 2, num_offloadable=2, io_wait_since=1.0, client="a", num_on_host=3),  # waste 2 x 8
         usage("a2", 1.0, 2, num_offloadable=2, io_wait_since=2.0, client="a", num_on_host=3),  # 2 x 7
         usage("a3", 2.0, 1, num_offloadable=1, io_wait_since=3.0, client="a", num_on_host=2),  # 1 x 6
         usage("b1", 5.0, 0, client="b")]
HOARD_SHARES = FairShares.of(5, held_by_client(HOARD), wanting={"b"})


def test_preempt_swaps_out_a_client_over_its_share_for_one_within_it():
    policy = ExhaustionPolicy.preempt()
    decide = functools.partial(choose_victims, policy, HOARD, "b1", 3, now=9.0, requested=3)
    assert decide(num_free_host_slots=8, shares=HOARD_SHARES) == Decision(offload=("a1", "a2"))
    # running instances of a client over its share are swapped out too, whatever their age
    running = [dataclasses.replace(u, io_wait_since=None) for u in HOARD]
    assert choose_victims(policy, running, "b1", 3, now=9.0, num_free_host_slots=8, shares=HOARD_SHARES,
                          requested=3) == Decision(offload=("a3", "a2"))
    # without shares, only instances newer than the requester are: b waits
    assert choose_victims(policy, running, "b1", 3, now=9.0, num_free_host_slots=8) == Decision(wait=True)


def test_preempt_ends_idle_holders_over_their_share_that_the_host_tier_has_no_room_for():
    """The host tier is full (of a's pages too): a's most wasteful idle holder ends, which frees its host
    slots for the next to be swapped out. Without shares nothing can move, the holders sleep, and the
    newcomer would wait for ever."""
    policy = ExhaustionPolicy.preempt()
    decide = functools.partial(choose_victims, policy, HOARD, "b1", 3, now=9.0, num_free_host_slots=0)
    assert decide() == Decision(wait=True)
    assert decide(shares=HOARD_SHARES, requested=3) == Decision(terminate=("a1",), offload=("a2",), over_share=True)
    # one slot: a3 fits and is swapped out first; a1, the most wasteful of those that do not, ends
    assert decide(num_free_host_slots=1, shares=HOARD_SHARES, requested=3) == Decision(
        terminate=("a1",), offload=("a3",), over_share=True)


def test_a_client_never_takes_pages_another_needs_below_its_share():
    policy = ExhaustionPolicy.preempt()
    # b holds its share; a, over its own, asks for more: b's idle instance is not touched, a waits
    fleet = [usage("a1", 0.0, 3, num_offloadable=3, client="a"), usage("b1", 1.0, 2, num_offloadable=2,
                                                                      io_wait_since=1.0, client="b")]
    shares = FairShares.of(5, held_by_client(fleet), wanting={"a"})
    assert choose_victims(policy, fleet, "a1", 1, now=9.0, num_free_host_slots=8, shares=shares,
                          requested=1) == Decision(wait=True)
    assert choose_victims(policy, fleet, "a1", 1, now=9.0, num_free_host_slots=8) == Decision(offload=("b1",))
    # one within its share takes only from clients beyond theirs: c, at its share, keeps its pages though
    # it wastes the most; b gives one instance's
    fleet = [usage("c1", 0.0, 2, num_offloadable=2, io_wait_since=0.0, client="c"),
             usage("b1", 1.0, 2, num_offloadable=2, io_wait_since=5.0, client="b"),
             usage("b2", 2.0, 2, num_offloadable=2, io_wait_since=6.0, client="b"), usage("a1", 3.0, 0, client="a")]
    shares = FairShares.of(6, held_by_client(fleet), wanting={"a"})
    assert (shares.share, shares.floor, shares.above("b"), shares.above("c")) == (2, 2, 2, 0)
    decide = functools.partial(choose_victims, policy, fleet, "a1", 2, now=9.0, num_free_host_slots=8)
    assert decide(shares=shares, requested=2) == Decision(offload=("b1",))
    assert decide() == Decision(offload=("c1",))
