"""``embeds``: allocate and free embeds, and embed text into them."""

from __future__ import annotations

from oven.control.scheduling.footprint import Embed
from oven.proto import inference as p

from .. import futures as f
from .issue import Call, allocate, deallocate, issue


def embed_text(inst, q: int, tokens: list[int], positions: list[int], embeds: list[int]) -> int:
    def build():
        ids = inst.resources.physical_embeds(embeds)
        return Call(p.EmbedTextItem(list(tokens), list(positions), ids), len(tokens),
                    writes=frozenset(Embed(e) for e in ids))
    return issue(inst, q, "embed_text", f.UNIT, build)


FUNCS = {
    "alloc-embeds": lambda inst, q, count: allocate(inst, q, "embeds", count),
    "dealloc-embeds": lambda inst, q, embeds: deallocate(inst, q, "embeds", embeds),
    "embed-text": embed_text,
}
