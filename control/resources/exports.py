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
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Container, Hashable, Iterable
from dataclasses import dataclass

from .pool import PhysicalPool
from .slab import ResourceError
from .table import ResourceTable

MAX_NAME_BYTES = 256  # names are kept in control memory for as long as the export lives
# Exports one client's inferlets may hold together: an export outlives its exporter, so without a
# bound an inferlet could leave any number behind (many names on one page cost no KV at all).
MAX_EXPORTS_PER_CLIENT = 4096


@dataclass(frozen=True, slots=True)
class Export:
    name: str
    owner_id: Hashable  # instance id of the exporter
    page_ids: tuple[int, ...]  # physical KvPage ids, in the exporter's order
    namespace: str = ""  # the exporter's client: names are per client, and so is who may import them


class ExportRegistry:
    """Every live export over one KvPage pool, by (namespace, name).

    A namespace is a client of the server: an inferlet sees and imports only the exports of
    inferlets of its own client, so one client's KV (its prompts) never reaches another's.
    """

    def __init__(self, kv_pool: PhysicalPool):
        self.kv_pool = kv_pool
        self._export_by_name: dict[tuple[str, str], Export] = {}
        self._count_by_namespace: Counter[str] = Counter()

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
        return self.kv_pool.release(export.page_ids)

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
