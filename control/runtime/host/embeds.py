"""``embeds``: allocate and free embeds, and embed text into them."""

from __future__ import annotations

from oven.proto import inference as p

from oven.control.scheduling import Embed

from .. import futures as f
from .issue import issue


def alloc_embeds(inst, q: int, count: int) -> int:
    fut = inst.futures.create(f.HANDLES)
    inst.loop.allocate(inst, q, "embeds", count, fut)
    return fut.handle


def dealloc_embeds(inst, q: int, embeds: list[int]) -> int:
    fut = inst.futures.create(f.UNIT)
    inst.loop.deallocate(inst, q, "embeds", embeds, fut)
    return fut.handle


def embed_text(inst, q: int, tokens: list[int], positions: list[int], embeds: list[int]) -> int:
    def build():
        ids = inst.resources.physical_embeds(embeds)
        return p.EmbedTextItem(list(tokens), list(positions), ids), len(tokens), {Embed(e) for e in ids}, set()
    return issue(inst, q, "embed_text", f.UNIT, build)


FUNCS = {"alloc-embeds": alloc_embeds, "dealloc-embeds": dealloc_embeds, "embed-text": embed_text}
