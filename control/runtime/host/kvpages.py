"""``kvpages``: allocate, free, copy, mask, offload/restore, share KvPages (exports and named snapshots),
and declare them recomputable."""

from __future__ import annotations

from oven.control.scheduling.footprint import KvSlots
from oven.proto import inference as p

from .. import futures as f
from .issue import Call, allocate, deallocate, issue, move_pages, resource_call


def copy_kvpage(inst, q: int, src: int, dst: int, src_offset: int, dst_offset: int, count: int) -> int:
    def build():
        src_id, dst_id = inst.resources.physical_pages([src, dst])
        inst.host.exports.check_writable([dst_id])
        item = p.CopyKvPageItem(src_id, dst_id, src_offset, dst_offset, count)
        try:
            return Call(item, reads=frozenset({KvSlots(src_id, src_offset, src_offset + count)}),
                        writes=frozenset({KvSlots(dst_id, dst_offset, dst_offset + count)}))
        except ValueError:  # empty or negative range: the inference layer reports the exact error
            return Call(item)
    return issue(inst, q, "copy_kvpage", f.UNIT, build)


def restore_discarded(inst, pages: list[int]) -> list[int]:
    """The inferlet rewrites these pages now: those that were discarded come back, and the forwards that
    rewrite them count as recomputing (InferenceCalls.rewrite_s), as no other forward does."""
    restored = inst.resources.restore_discarded(pages)
    inst.rewriting_page_ids.update(inst.resources.physical_pages(restored))
    return restored


def mask_kvpage(inst, q: int, page: int, masked: list[bool]) -> int:
    def build():
        (page_id,) = inst.resources.physical_pages([page])
        inst.host.exports.check_writable([page_id])
        return Call(p.MaskKvPageItem(page_id, list(masked)), writes=frozenset({KvSlots.page(page_id)}))
    return issue(inst, q, "mask_kvpage", f.UNIT, build)


FUNCS = {
    "alloc-kvpages": lambda inst, q, count: allocate(inst, q, "kvpages", count),
    "dealloc-kvpages": lambda inst, q, pages: deallocate(inst, q, "kvpages", pages),
    "copy-kvpage": copy_kvpage,
    "mask-kvpage": mask_kvpage,
    "offload-kvpages": lambda inst, q, pages: move_pages(inst, q, pages, "offload"),
    "restore-kvpages": lambda inst, q, pages: move_pages(inst, q, pages, "restore"),
    # Export names are per client: an inferlet imports only what its own client's inferlets exported.
    "export-kvpages": lambda inst, pages, name: resource_call(lambda: inst.host.placement.export(inst, pages, name)),
    "import-kvpages": lambda inst, name: resource_call(lambda: inst.host.placement.import_(inst, name)),
    "release-export": lambda inst, name: resource_call(lambda: inst.host.allocator.drop_export(name, by=inst)),
    # Named snapshots (resources/exports.py): per client, read-only, matched by their tokens' prefix.
    "save-snapshot": lambda inst, pages, tokens, name: resource_call(
        lambda: inst.host.placement.save_snapshot(inst, pages, tokens, name)),
    "open-snapshot": lambda inst, name: resource_call(lambda: inst.host.placement.open_snapshot(inst, name)),
    "snapshot-tokens": lambda inst, name: resource_call(lambda: inst.host.placement.snapshot_tokens(inst, name)),
    "match-snapshot": lambda inst, tokens: inst.host.placement.match_snapshot(inst, tokens),
    "drop-snapshot": lambda inst, name: resource_call(lambda: inst.host.allocator.drop_snapshot(name, inst.owner)),
    # InferCept's discard (runtime/interceptions.py): which pages the policy may discard, and taking them back.
    "set-recomputable": lambda inst, pages, recomputable: resource_call(
        lambda: inst.resources.set_recomputable(pages, recomputable)),
    "restore-discarded": lambda inst, pages: resource_call(lambda: restore_discarded(inst, pages)),
}
