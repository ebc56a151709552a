"""Turning a guest call into a queued command, with bad handles reported through the future."""

from __future__ import annotations

from typing import Callable, NamedTuple

from oven.control.resources.slab import ResourceError
from oven.control.scheduling.footprint import Resource

from .. import futures as f


class Call(NamedTuple):  # a tuple: built on every call, the hot path of decoding
    """One guest call in physical ids, as :meth:`InferenceCalls.submit` takes it (see ``Command``)."""

    item: object
    num_tokens: int = 1
    reads: frozenset[Resource] = frozenset()
    writes: frozenset[Resource] = frozenset()
    kv_context: tuple[list[int], int, int, int] | None = None


def issue(inst, q: int, call_type: str, kind: str, build: Callable[[], Call]) -> int:
    """Create a future, resolve handles with ``build()`` and queue the call on ``q``.

    A ResourceError from ``build`` (a foreign, freed or forged handle) fails the
    future instead of trapping.
    """
    fut = inst.futures.create(kind)
    inst.placed = True
    try:
        item, num_tokens, reads, writes, kv_context = build()
    except ResourceError as exc:
        inst.futures.fail(fut, str(exc))
        return fut.handle
    inst.host.calls.submit(inst, q, call_type, item, fut, num_tokens=num_tokens, reads=reads, writes=writes,
                           kv_context=kv_context)
    return fut.handle


def check_kv_writes(inst, page_ids: list[int], last_page_len: int, num_inputs: int) -> None:
    """ResourceError if a forward of ``num_inputs`` inputs over this paged context (they are its last
    slots, written there) would write into a snapshot's page. Costs nothing while no snapshot lives."""
    exports = inst.host.exports
    if exports.num_read_only_pages and page_ids:
        ps = inst.host.info.page_size
        first = max((len(page_ids) - 1) * ps + last_page_len - num_inputs, 0) // ps
        exports.check_writable(page_ids[first:])


def resource_call(action: Callable):
    """Run a synchronous resource operation as a WIT ``result``: its value, or the error text."""
    try:
        value = action()
    except ResourceError as exc:
        return str(exc)
    return value


def allocate(inst, q: int, kind: str, count: int) -> int:
    """``alloc-kvpages`` / ``alloc-embeds``: a future of the new handles."""
    fut = inst.futures.create(f.HANDLES)
    inst.placed = True
    inst.host.allocator.allocate(inst, q, kind, count, fut)
    return fut.handle


def deallocate(inst, q: int, kind: str, handles: list[int]) -> int:
    """``dealloc-kvpages`` / ``dealloc-embeds``: freed once the queue's earlier calls are done."""
    fut = inst.futures.create(f.UNIT)
    inst.host.allocator.deallocate(inst, q, kind, handles, fut)
    return fut.handle


def move_pages(inst, q: int, pages: list[int], direction: str) -> int:
    """``offload-kvpages`` / ``restore-kvpages``."""
    fut = inst.futures.create(f.UNIT)
    inst.host.allocator.move_pages(inst, q, pages, direction, fut)
    return fut.handle
