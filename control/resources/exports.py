"""Named KvPage exports: how inferlets share KV cache (Pie's export_kvpage / import_kvpage).

An export holds its own reference on every page, so the pages outlive the
exporter's dealloc *and its exit*; each import takes one more reference per
page into the importer's table; a physical page is freed only when the last
of these holders lets go. Pages are shared, not copied: the runtime, not this
module, decides whether writes to a shared page are allowed.

Lifetime: an export lasts until it is released, as in Pie. Outliving the
exporter is the point — a prompt-cache inferlet exports a system prompt's KV
once and exits, and later inferlets import it. Only the exporter may
``unexport`` while it runs; ``drop`` is for the runtime itself, which drops

* every export of an instance that was killed (trap, ``oven kill``, lease
  expiry): its KV may be half written, and the issue's contract is that a
  killed instance leaves nothing behind;
* *orphans* (exports whose exporter has ended) when the KvPage pool runs out,
  oldest first, before the exhaustion policy touches a running instance
  (:meth:`reclaim_orphans`): an orphan is a cache, a running instance's pages
  are its state;
* whatever an operator names (``oven exports --drop NAME``).

A *snapshot* is an export that also records the token ids its pages hold (``save_snapshot``). It
belongs to its client, not to the instance that saved it: any inferlet of that client may open it
(an import), match a new context's tokens against it (:meth:`ExportRegistry.match_snapshot`, a
:class:`PrefixIndex` per client) or drop it; another client never sees it. Its pages are
read-only for everyone (:meth:`ExportRegistry.check_writable`: the host refuses a forward, mask or
copy that would write one), so what it holds never changes while it lives; readers fork by copying
a page before writing (the SDKs do). The tokens are the saver's word: the server cannot check
them against the K/V, so a lying inferlet misleads only its own client. Snapshots are capped per
client (:class:`SnapshotLimits`, settings of the control process) and, with no exporter running,
are dropped like orphans when the KvPage pool runs out (a cache gives way to running instances).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Container, Hashable, Iterable
from dataclasses import dataclass

from .pool import PhysicalPool
from .prefix_index import PrefixIndex
from .slab import ResourceError
from .table import ResourceTable

MAX_NAME_BYTES = 256  # names are kept in control memory for as long as the export lives
# Exports one client's inferlets may hold together: an export outlives its exporter, so without a
# bound an inferlet could leave any number behind (many names on one page cost no KV at all).
MAX_EXPORTS_PER_CLIENT = 4096


@dataclass(frozen=True, slots=True)
class SnapshotLimits:
    """What one client's snapshots may hold together (``max_snapshots_per_client`` and
    ``max_snapshot_pages_per_client``, control settings)."""

    max_count: int = 64
    max_pages: int = 4096


@dataclass(frozen=True, slots=True)
class Export:
    name: str
    owner_id: Hashable  # instance id of the exporter; None for a snapshot (its client's, not an instance's)
    page_ids: tuple[int, ...]  # physical KvPage ids, in the exporter's order
    namespace: str = ""  # the exporter's client: names are per client, and so is who may import them
    tokens: tuple[int, ...] | None = None  # a snapshot's token ids (its pages hold their K/V); None otherwise


class ExportRegistry:
    """Every live export over one KvPage pool, by (namespace, name).

    A namespace is a client of the server: an inferlet sees and imports only the exports of
    inferlets of its own client, so one client's KV (its prompts) never reaches another's.
    """

    def __init__(self, kv_pool: PhysicalPool, page_size: int = 16, snapshot_limits: SnapshotLimits = SnapshotLimits()):
        self.kv_pool, self.page_size, self.snapshot_limits = kv_pool, page_size, snapshot_limits
        self._export_by_name: dict[tuple[str, str], Export] = {}
        self._count_by_namespace: Counter[str] = Counter()
        self._index_by_namespace: dict[str, PrefixIndex] = {}  # snapshots' tokens, per client
        self._snapshot_pages: Counter[str] = Counter()  # pages each client's snapshots hold
        self._read_only: Counter[int] = Counter()  # page id -> snapshots holding it

    def __len__(self) -> int:
        return len(self._export_by_name)

    def __contains__(self, key: object) -> bool:
        """``(namespace, name)`` or a bare name of the default namespace."""
        return (key if isinstance(key, tuple) else ("", key)) in self._export_by_name

    def export_kvpages(self, owner: ResourceTable, name: str, handles: Iterable[int], namespace: str = "") -> None:
        """Publish the owner's device pages under ``name``; the owner keeps its handles.

        Raises ResourceError for a taken or malformed name, no handle, an unknown, repeated or
        host-resident handle, or the client's MAX_EXPORTS_PER_CLIENT reached; nothing changes then.
        """
        self._check_pool(owner)
        _check_name(name)
        if (namespace, name) in self._export_by_name:
            raise ResourceError(f"export name {name!r} is taken")
        if self._count_by_namespace[namespace] >= MAX_EXPORTS_PER_CLIENT:
            raise ResourceError(f"this client has {MAX_EXPORTS_PER_CLIENT} exports already: release some first")
        handles = list(handles)
        if not handles:
            raise ResourceError(f"export {name!r} names no kvpage")
        if len(set(handles)) != len(handles):
            raise ResourceError(f"export {name!r} names a kvpage handle twice")
        page_ids = owner.physical_pages(handles)
        self.kv_pool.retain(page_ids)
        self._export_by_name[(namespace, name)] = Export(name, owner.instance_id, tuple(page_ids), namespace)
        self._count_by_namespace[namespace] += 1

    def import_kvpages(self, importer: ResourceTable, name: str, namespace: str = "") -> list[int]:
        """Fresh handles in the importer's space for the pages of ``name``, in export order.

        Raises ResourceError for an unknown name and QuotaExceeded past the
        importer's KvPage quota. Importing the same name twice gives two sets of
        handles onto the same pages.
        """
        self._check_pool(importer)
        return importer.adopt_kvpages(self._get(name, namespace).page_ids)

    def unexport(self, name: str, instance_id: Hashable, namespace: str = "") -> list[int]:
        """Release ``name`` on behalf of ``instance_id``, which must be its exporter; the pages freed.

        Pages still held by the exporter or importers stay; the others are freed.
        """
        export = self._get(name, namespace)
        if export.tokens is not None:
            raise ResourceError(f"{name!r} is a snapshot: drop it with drop-snapshot")
        if export.owner_id != instance_id:
            raise ResourceError(f"export {name!r} belongs to another inferlet; only its exporter may release it")
        return self.drop(name, namespace)

    def drop(self, name: str, namespace: str = "") -> list[int]:
        """Release ``name`` whoever exported it (the runtime's own call, not an inferlet's); the pages freed."""
        export = self._get(name, namespace)
        del self._export_by_name[(namespace, name)]
        self._count_by_namespace[namespace] -= 1
        if not self._count_by_namespace[namespace]:
            del self._count_by_namespace[namespace]
        if export.tokens is not None:
            self._forget_snapshot(export)
        return self.kv_pool.release(export.page_ids)

    # -- snapshots -------------------------------------------------------------------------------

    def save_snapshot(self, owner: ResourceTable, name: str, handles: Iterable[int], tokens: Iterable[int],
                      namespace: str = "", elsewhere: tuple[int, int] = (0, 0)) -> None:
        """Keep the owner's device pages and the ``tokens`` they hold as snapshot ``name`` of client
        ``namespace``; the owner keeps its handles, now read-only. ``elsewhere``: (snapshots, pages)
        the client holds on other replicas, which count against its caps too.

        Raises ResourceError for what ``export_kvpages`` refuses, for tokens that do not fill the pages
        (one page per ``page_size`` tokens, the last one partly) and past the client's caps; nothing
        changes then.
        """
        tokens = tuple(tokens)
        handles = list(handles)
        if not tokens:
            raise ResourceError(f"snapshot {name!r} holds no token")
        needed = -(-len(tokens) // self.page_size)
        if len(handles) != needed:
            raise ResourceError(f"snapshot {name!r}: {len(tokens)} tokens fill {needed} kvpages, not {len(handles)}")
        count, pages = self.snapshot_usage(namespace)
        count, pages = count + elsewhere[0], pages + elsewhere[1]
        limits = self.snapshot_limits
        if count >= limits.max_count:
            raise ResourceError(f"this client has {count} snapshots, the most it may keep "
                                f"(max_snapshots_per_client): drop some first")
        if pages + needed > limits.max_pages:
            raise ResourceError(f"this client's snapshots hold {pages} kvpages; {needed} more would pass "
                                f"{limits.max_pages} (max_snapshot_pages_per_client): drop some first")
        self.export_kvpages(owner, name, handles, namespace)
        export = self._export_by_name[(namespace, name)]
        snapshot = Export(name, None, export.page_ids, namespace, tokens)
        self._export_by_name[(namespace, name)] = snapshot
        self._index_by_namespace.setdefault(namespace, PrefixIndex(self.page_size)).add(name, tokens)
        self._snapshot_pages[namespace] += len(snapshot.page_ids)
        self._read_only.update(snapshot.page_ids)

    def snapshot(self, name: str, namespace: str = "") -> Export:
        """Client ``namespace``'s snapshot ``name``; ResourceError if it has none by that name."""
        export = self._export_by_name.get((namespace, name)) if isinstance(name, str) else None
        if export is None or export.tokens is None:
            raise ResourceError(f"no snapshot named {name!r}")
        return export

    def drop_snapshot(self, name: str, namespace: str = "") -> list[int]:
        """Drop client ``namespace``'s snapshot ``name`` (any of its inferlets may); the pages freed
        (those no reader holds)."""
        return self.drop(self.snapshot(name, namespace).name, namespace)

    def match_snapshot(self, tokens: Iterable[int], namespace: str = "") -> tuple[str | None, int]:
        """Client ``namespace``'s snapshot sharing the longest prefix with ``tokens`` and that prefix's
        length (the oldest of those tied); ``(None, 0)`` if none shares the first token."""
        index = self._index_by_namespace.get(namespace)
        return (None, 0) if index is None else index.longest(list(tokens))

    def snapshot_usage(self, namespace: str) -> tuple[int, int]:
        """(snapshots, kvpages) client ``namespace`` keeps here."""
        index = self._index_by_namespace.get(namespace)
        return (0 if index is None else len(index)), self._snapshot_pages[namespace]

    @property
    def num_read_only_pages(self) -> int:
        return len(self._read_only)

    def check_writable(self, page_ids: Iterable[int]) -> None:
        """ResourceError if a snapshot holds one of these pages: what it holds must never change."""
        if self._read_only:
            for page_id in page_ids:
                if page_id in self._read_only:
                    raise ResourceError("a kvpage of a snapshot is read-only: copy it into a page of your own "
                                        "before writing (the SDKs' copy-on-write)")

    def _forget_snapshot(self, export: Export) -> None:
        index = self._index_by_namespace[export.namespace]
        index.remove(export.name)
        if not len(index):
            del self._index_by_namespace[export.namespace]
        self._snapshot_pages[export.namespace] -= len(export.page_ids)
        if not self._snapshot_pages[export.namespace]:
            del self._snapshot_pages[export.namespace]
        self._read_only.subtract(export.page_ids)
        for page_id in export.page_ids:
            if not self._read_only[page_id]:
                del self._read_only[page_id]

    def get(self, name: str, namespace: str = "") -> Export:
        return self._get(name, namespace)

    def list_exports(self) -> list[tuple[str, int]]:
        """(name, number of pages) of every export, sorted by name."""
        return sorted((e.name, len(e.page_ids)) for e in self._export_by_name.values())

    def exports(self) -> list[Export]:
        """Every export, oldest first."""
        return list(self._export_by_name.values())

    def reclaim_orphans(self, needed: int, running: Container[Hashable]) -> list[Export]:
        """Drop orphans (exporter not in ``running``), oldest first, until ``needed`` pages came free.

        Only an orphan holding a page that no one but orphans holds is dropped: one whose
        pages all live on in importers frees nothing and stays importable. Returns the
        dropped exports (none when no orphan frees anything).
        """
        orphans = [e for e in self._export_by_name.values() if e.owner_id not in running]
        orphan_refs = Counter(page for export in orphans for page in export.page_ids)
        freeable = {page for page, refs in orphan_refs.items() if self.kv_pool.refcount(page) == refs}
        dropped, freed = [], 0
        for export in orphans:
            if freed >= needed:
                break
            if freeable.intersection(export.page_ids):  # (a page two orphans share frees with the second)
                freed += len(self.drop(export.name, export.namespace))
                dropped.append(export)
        return dropped

    def num_freed_by_exit(self, table: ResourceTable) -> int:
        """Device KvPages that no one holds but ``table`` and its instance's exports: what the
        instance's exit gives back (a killed one's exports go with it; an ended one's are
        dropped as orphans when the pool runs out)."""
        holds = Counter(table.device_page_ids())
        holds.update(page for export in self._export_by_name.values() if export.owner_id == table.instance_id
                     for page in export.page_ids)
        return sum(1 for page, n in holds.items() if self.kv_pool.refcount(page) == n)

    def exported_by(self, instance_id: Hashable) -> list[Export]:
        return [export for export in self._export_by_name.values() if export.owner_id == instance_id]

    def _get(self, name: str, namespace: str) -> Export:
        export = self._export_by_name.get((namespace, name)) if isinstance(name, str) else None
        if export is None:
            raise ResourceError(f"no kvpage export named {name!r}")
        return export

    def _check_pool(self, table: ResourceTable) -> None:
        # A table over another pool would make the page ids meaningless here: a wiring bug, not an inferlet's.
        if table.kv_pool is not self.kv_pool:
            raise ValueError("table and export registry use different KvPage pools")


def _check_name(name: object) -> None:
    if not isinstance(name, str) or not name:
        raise ResourceError(f"export name must be a non-empty string, got {name!r}")
    if len(name.encode()) > MAX_NAME_BYTES:
        raise ResourceError(f"export name is {len(name.encode())} bytes; at most {MAX_NAME_BYTES}")
