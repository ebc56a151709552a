"""One inferlet instance's resources: its virtual handles and the physical ids behind them.

The inference layer only knows physical ids; an inferlet only ever sees the u32
handles of its own table, so another instance's handles are simply unknown
here. KvPages and Embeds have separate handle spaces.

A KvPage handle lives on the *device* (a KvPage of the GPU pool) or on the
*host* (a slot of the host tier, after an offload). The handle the inferlet
holds does not change when its data moves; only ``physical_pages`` refuses a
host-resident handle, because the device cannot attend over it until restored.

A page the inferlet declared *recomputable* (it can rewrite the K/V from its own
tokens) may be *discarded* while the instance waits on I/O (InferCept's
discard): its device page is freed and the handle is DISCARDED; when the
instance is due to run again it gets a fresh, fully masked page (BLANK), and
``physical_pages`` refuses it with an error starting :data:`KV_DISCARDED` until
the inferlet says it rewrites it (``restore_discarded``). That check sits in
the branch that already refuses host-resident handles, so the common path pays
nothing for it. Pages a ``forward`` wrote embeds into are never discarded: the
inferlet may not hold the inputs that made them.

Every physical id this table names carries one reference in its pool, held
for as long as the handle lives; ``release_all`` drops them all when the
instance exits or is killed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable
from dataclasses import dataclass

from .pool import PhysicalPool
from .slab import HandleSlab, ResourceError

DEVICE = "device"
HOST = "host"
DISCARDED = "discarded"  # its K/V was discarded and it holds no page (physical id -1)
BLANK = "blank"  # a fresh masked device page in place of a discarded one, not yet declared rewritten
# The start of the error a forward over a discarded page fails with (documented in the WIT).
KV_DISCARDED = "kv discarded:"


@dataclass(frozen=True, slots=True)
class PagePlacement:
    """Where a KvPage handle's data is: a KvPage id on DEVICE or BLANK, a host slot id on HOST,
    nothing (-1) when DISCARDED."""

    location: str
    physical_id: int


class QuotaExceeded(ResourceError):
    """The instance asked for more than its per-instance quota of ``kind``."""

    def __init__(self, kind: str, requested: int, held: int, quota: int):
        super().__init__(f"{kind} quota exceeded: holding {held}, asked for {requested} more, quota is {quota}")
        self.kind = kind
        self.requested = requested
        self.held = held
        self.quota = quota


class ResourceTable:
    """Handles of one instance over shared pools.

    ``max_kvpages`` bounds the KvPage handles held at once, whatever their origin
    (allocated or imported) or location (device or host): handles cost control
    memory too, so importing one name a million times must hit a limit. An
    allocation is bounded by the KvPage pool's size too, whatever ``max_kvpages``
    allows: one that could never be met fails at once, as a quota.
    ``max_embeds`` bounds Embed handles. None means no quota beyond the pools.
    """

    def __init__(
        self,
        instance_id: Hashable,
        kv_pool: PhysicalPool,
        embed_pool: PhysicalPool,
        host_pool: PhysicalPool | None = None,
        *,
        max_kvpages: int | None = None,
        max_embeds: int | None = None,
    ):
        for name, quota in (("max_kvpages", max_kvpages), ("max_embeds", max_embeds)):
            if quota is not None and quota < 0:
                raise ValueError(f"{name} must be >= 0 or None, got {quota}")
        self.instance_id = instance_id
        self.kv_pool, self.embed_pool, self.host_pool = kv_pool, embed_pool, host_pool
        self.max_kvpages, self.max_embeds = max_kvpages, max_embeds
        self.closed = False  # set by release_all: no allocation after exit
        self._pages: HandleSlab[PagePlacement] = HandleSlab("kvpage")
        self._embeds: HandleSlab[int] = HandleSlab("embed")
        self._recomputable: set[int] = set()  # kvpage handles the inferlet can rewrite from its tokens
        self._embed_written: set[int] = set()  # kvpage handles a forward wrote embeds into: never discarded

    @property
    def num_kvpages(self) -> int:
        return len(self._pages)

    @property
    def num_embeds(self) -> int:
        return len(self._embeds)

    @property
    def num_offloaded(self) -> int:
        return sum(1 for _, placement in self._pages.items() if placement.location == HOST)

    @property
    def num_discarded(self) -> int:
        """Handles whose K/V was discarded and not yet declared rewritten (DISCARDED or BLANK)."""
        return sum(1 for _, placement in self._pages.items() if placement.location in (DISCARDED, BLANK))

    # -- allocation -------------------------------------------------------

    def alloc_kvpages(self, n: int) -> list[int]:
        """``n`` new device KvPages. QuotaExceeded (past ``max_kvpages`` or the pool's size) before
        PoolExhausted; all or nothing."""
        quota = self.kv_pool.size if self.max_kvpages is None else min(self.max_kvpages, self.kv_pool.size)
        self._check_alloc("kvpage", n, len(self._pages), quota)
        return [self._pages.insert(PagePlacement(DEVICE, page_id)) for page_id in self.kv_pool.allocate(n)]

    def adopt_kvpages(self, page_ids: Iterable[int]) -> list[int]:
        """New handles for pages someone else already holds (an import), taking one reference each.

        Raises QuotaExceeded, or ResourceError if a page is free.
        """
        page_ids = list(page_ids)
        self._check_alloc("kvpage", len(page_ids), len(self._pages), self.max_kvpages)
        self.kv_pool.retain(page_ids)
        return [self._pages.insert(PagePlacement(DEVICE, page_id)) for page_id in page_ids]

    def alloc_embeds(self, n: int) -> list[int]:
        """``n`` new Embeds. QuotaExceeded before PoolExhausted; all or nothing."""
        self._check_alloc("embed", n, len(self._embeds), self.max_embeds)
        return [self._embeds.insert(embed_id) for embed_id in self.embed_pool.allocate(n)]

    def dealloc_kvpages(self, handles: Iterable[int]) -> None:
        """Drop the handles (device or host); ResourceError, changing nothing, if any is not live or repeats."""
        handles = list(handles)
        self._pages.check(handles)
        self._release_placements([self._pages.remove(handle) for handle in handles])
        self._recomputable.difference_update(handles)
        self._embed_written.difference_update(handles)

    def dealloc_embeds(self, handles: Iterable[int]) -> None:
        handles = list(handles)
        self._embeds.check(handles)
        self.embed_pool.release([self._embeds.remove(handle) for handle in handles])

    def release_all(self) -> None:
        """Return every page, host slot and embed to its pool and close the table. Idempotent."""
        if self.closed:
            return
        self.closed = True
        self._release_placements([self._pages.remove(handle) for handle in self._pages])
        self._recomputable.clear()
        self._embed_written.clear()
        self.embed_pool.release([self._embeds.remove(handle) for handle in self._embeds])

    # -- lookup -------------------------------------------------------------

    def physical_pages(self, handles: Iterable[int]) -> list[int]:
        """Device KvPage ids, in order; ResourceError for an unknown or host-resident handle."""
        page_ids = []
        for handle in handles:
            placement = self._pages.get(handle)
            if placement.location != DEVICE:
                if placement.location == HOST:
                    raise ResourceError(f"kvpage handle {handle} is offloaded to the host tier; restore it first")
                raise ResourceError(f"{KV_DISCARDED} kvpage handle {handle} lost its K/V while the inferlet waited "
                                    "(the server's interception policy); rewrite it after restore-discarded")
            page_ids.append(placement.physical_id)
        return page_ids

    def physical_embeds(self, handles: Iterable[int]) -> list[int]:
        return [self._embeds.get(handle) for handle in handles]

    def host_slots(self, handles: Iterable[int]) -> list[int]:
        """Host-tier slot ids of offloaded handles, in order (what a restore copies from)."""
        slot_ids = []
        for handle in handles:
            placement = self._pages.get(handle)
            if placement.location != HOST:
                where = "on the device" if placement.location == DEVICE else placement.location
                raise ResourceError(f"kvpage handle {handle} is {where}, not offloaded")
            slot_ids.append(placement.physical_id)
        return slot_ids

    def location(self, handle: int) -> str:
        """DEVICE, HOST, DISCARDED or BLANK."""
        return self._pages.get(handle).location

    def kvpage_handles(self, location: str | None = None) -> list[int]:
        """Live KvPage handles in issue order, optionally only those at ``location``."""
        return [h for h, placement in self._pages.items() if location in (None, placement.location)]

    def embed_handles(self) -> list[int]:
        return list(self._embeds)

    def exclusive_device_handles(self) -> list[int]:
        """Device handles whose page no one else references (no export, no importer).

        Only these give GPU memory back when offloaded or when the instance
        exits; offloading a shared page would cost a host slot and free nothing.
        """
        device = [(h, placement.physical_id) for h, placement in self._pages.items() if placement.location == DEVICE]
        holds_by_page_id = Counter(page_id for _, page_id in device)
        return [h for h, page_id in device if self.kv_pool.refcount(page_id) == holds_by_page_id[page_id]]

    def device_page_ids(self) -> list[int]:
        """The physical page of every device handle, blank ones included (a page twice if two handles
        name it)."""
        return [placement.physical_id for _, placement in self._pages.items() if placement.location in (DEVICE, BLANK)]

    # -- discard ----------------------------------------------------------------

    def set_recomputable(self, handles: Iterable[int], recomputable: bool) -> None:
        """The inferlet can (or can no longer) rewrite these pages' K/V from its own tokens; ResourceError,
        changing nothing, for a handle it does not hold."""
        handles = list(handles)
        self._pages.check(handles)
        if recomputable:
            self._recomputable.update(handles)
        else:
            self._recomputable.difference_update(handles)

    def note_embeds_written(self, handles: Iterable[int]) -> None:
        """A forward wrote embeds (inputs the control layer does not keep) into these pages."""
        self._embed_written.update(handles)

    def discardable_handles(self) -> list[int]:
        """Device handles whose K/V may be discarded: recomputable, no embeds written into them, and no
        one else holding their page (freeing a shared page frees nothing and breaks its other holders)."""
        return [h for h in self.exclusive_device_handles()
                if h in self._recomputable and h not in self._embed_written]

    def mark_discarded(self, handles: Iterable[int]) -> None:
        """Free the device pages of these handles (from :meth:`discardable_handles`); they stay valid."""
        handles = list(handles)
        self._pages.check(handles)
        for handle in handles:
            if self._pages.get(handle).location != DEVICE:
                raise ResourceError(f"kvpage handle {handle} is not on the device")
        page_ids = [self._pages.get(handle).physical_id for handle in handles]
        for handle in handles:
            self._pages.set(handle, PagePlacement(DISCARDED, -1))
        self.kv_pool.release(page_ids)

    def mark_blank(self, handles: Iterable[int], page_ids: Iterable[int]) -> None:
        """Give discarded handles fresh pages (allocated and masked by the caller, one reference each,
        which the table takes over); they stay refused until :meth:`restore_discarded`."""
        self._move(list(handles), list(page_ids), src=DISCARDED, dst=BLANK)

    def restore_discarded(self, handles: Iterable[int]) -> list[int]:
        """The inferlet rewrites these pages now: those among them that were discarded (in the order
        given) become usable again. ResourceError, changing nothing, for an unknown handle."""
        handles = list(handles)
        self._pages.check(handles)
        restored = [h for h in handles if self._pages.get(h).location == BLANK]
        for handle in restored:
            self._pages.set(handle, PagePlacement(DEVICE, self._pages.get(handle).physical_id))
        return restored

    # -- host tier ------------------------------------------------------------

    def mark_offloaded(self, handles: Iterable[int], host_slot_ids: Iterable[int]) -> None:
        """Record that each handle's data now lives in the matching host slot.

        Call once the inference layer acknowledged the copy. Each slot must be
        freshly allocated from the host pool by the caller (exactly one
        reference); the table takes that reference over and releases the
        handle's device page. On error nothing changes and the caller still owns
        the slots (and must release them).
        """
        self._move(list(handles), list(host_slot_ids), src=DEVICE, dst=HOST)

    def mark_restored(self, handles: Iterable[int], page_ids: Iterable[int]) -> None:
        """Record that each offloaded handle's data is back on the device in the matching page.

        The mirror of :meth:`mark_offloaded`: each page must be freshly allocated
        from the KvPage pool by the caller; the table takes that reference over
        and releases the handle's host slot.
        """
        self._move(list(handles), list(page_ids), src=HOST, dst=DEVICE)

    # -- internals ------------------------------------------------------------

    def _move(self, handles: list[int], new_ids: list[int], src: str, dst: str) -> None:
        src_pool, dst_pool = self._pool_of(src), self._pool_of(dst)
        if len(handles) != len(new_ids):
            raise ResourceError(f"{len(handles)} kvpage handles but {len(new_ids)} destination ids")
        self._pages.check(handles)
        for handle in handles:
            if (location := self._pages.get(handle).location) != src:
                where = f"on the {dst} already" if location == dst else f"{location}, not {src}"
                raise ResourceError(f"kvpage handle {handle} is {where}")
        if len(set(new_ids)) != len(new_ids):
            raise ResourceError(f"destination {dst_pool.kind} ids repeat: {new_ids}")
        for new_id in new_ids:
            if dst_pool.refcount(new_id) != 1:
                raise ResourceError(
                    f"{dst_pool.kind} {new_id} must be freshly allocated by the caller "
                    f"(has {dst_pool.refcount(new_id)} references, expected 1)"
                )
        old_ids = [self._pages.get(handle).physical_id for handle in handles]
        for handle, new_id in zip(handles, new_ids, strict=True):
            self._pages.set(handle, PagePlacement(dst, new_id))
        if src_pool is not None:
            src_pool.release(old_ids)

    def _pool_of(self, location: str) -> PhysicalPool | None:
        """The pool a placement at ``location`` holds a reference in (None: DISCARDED holds nothing)."""
        if location == HOST:
            return self._require_host_pool()
        return None if location == DISCARDED else self.kv_pool

    def _release_placements(self, placements: list[PagePlacement]) -> None:
        self.kv_pool.release([p.physical_id for p in placements if p.location in (DEVICE, BLANK)])
        host_slot_ids = [p.physical_id for p in placements if p.location == HOST]
        if host_slot_ids:
            self._require_host_pool().release(host_slot_ids)

    def _require_host_pool(self) -> PhysicalPool:
        if self.host_pool is None:
            raise ResourceError("this server has no host tier for KvPages")
        return self.host_pool

    def _check_alloc(self, kind: str, n: int, held: int, quota: int | None) -> None:
        if self.closed:
            raise ResourceError(f"instance {self.instance_id} has exited; it cannot take new {kind}s")
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ResourceError(f"cannot allocate {n!r} {kind}s")
        if quota is not None and held + n > quota:
            raise QuotaExceeded(kind, n, held, quota)
