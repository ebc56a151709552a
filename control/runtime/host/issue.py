"""Turning a guest call into a queued command, with bad handles reported through the future."""

from __future__ import annotations

from typing import Callable

from oven.control.resources import ResourceError

from .. import futures as f


def issue(inst, q: int, call_type: str, kind: str, build: Callable) -> int:
    """Create a future, resolve handles with ``build()`` and queue the command on ``q``.

    ``build`` returns (item, num_tokens, written keys, read keys, kv_context or None) in
    physical ids (``kv_context``: see ``Command``); a ResourceError (foreign, freed or forged
    handle) fails the future instead of trapping.
    """
    fut = inst.futures.create(kind)
    try:
        item, num_tokens, writes, reads, kv_context = build()
    except ResourceError as exc:
        inst.futures.fail(fut, str(exc))
        return fut.handle
    inst.loop.submit(inst, q, call_type, item, fut, num_tokens, frozenset(writes), frozenset(reads), kv_context)
    return fut.handle


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
    inst.loop.allocator.allocate(inst, q, kind, count, fut)
    return fut.handle


def deallocate(inst, q: int, kind: str, handles: list[int]) -> int:
    """``dealloc-kvpages`` / ``dealloc-embeds``: freed once the queue's earlier calls are done."""
    fut = inst.futures.create(f.UNIT)
    inst.loop.allocator.deallocate(inst, q, kind, handles, fut)
    return fut.handle


def move_pages(inst, q: int, pages: list[int], direction: str) -> int:
    """``offload-kvpages`` / ``restore-kvpages``."""
    fut = inst.futures.create(f.UNIT)
    inst.loop.allocator.move_pages(inst, q, pages, direction, fut)
    return fut.handle
