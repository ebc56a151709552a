"""``forward``: the forward pass, next-token distributions, and the fused forward-text path."""

from __future__ import annotations

from oven.control.resources import ResourceError
from oven.control.scheduling import Embed
from oven.proto import inference as p

from .. import futures as f
from .issue import Call, issue


def _kv_context(inst, page_ids: list[int], last_page_len: int, num_inputs: int) -> tuple:
    """The paged context a forward reads and writes, for its command's footprint (``Command.kv_context``)."""
    return page_ids, last_page_len, num_inputs, inst.host.info.page_size


def _adapter_id(inst, adapter: int) -> int:
    """``adapter`` if it is the base model or an adapter loaded now; a ResourceError fails the call's
    future (an id from a removed adapter, or one never opened)."""
    if adapter != p.BASE_MODEL and not inst.host.adapters.is_loaded(adapter):
        raise ResourceError(f"adapter {adapter} is not loaded on this server (open-adapter gives the ids)")
    return adapter


def forward(inst, q, pages, last_page_len, inputs, output_indices, outputs, mask, adapter) -> int:
    def build():
        adapter_id = _adapter_id(inst, adapter)
        page_ids = inst.resources.physical_pages(pages)
        in_ids, out_ids = inst.resources.physical_embeds(inputs), inst.resources.physical_embeds(outputs)
        if inputs:  # the pages it writes hold K/V of embeds the control layer does not keep: never discarded
            first_written = ((len(pages) - 1) * inst.host.info.page_size + last_page_len - len(inputs)) \
                // inst.host.info.page_size
            inst.resources.note_embeds_written(pages[max(first_written, 0):])
        item = p.ForwardItem(page_ids, last_page_len, in_ids, list(output_indices), out_ids,
                             [bytes(row) for row in mask] if mask else None, adapter_id=adapter_id)
        return Call(item, len(inputs), reads=frozenset(Embed(e) for e in in_ids),
                    writes=frozenset(Embed(e) for e in out_ids),
                    kv_context=_kv_context(inst, page_ids, last_page_len, len(inputs)))
    return issue(inst, q, "forward", f.UNIT, build)


def get_next_dist(inst, q: int, embed: int, top_k: int) -> int:
    def build():
        (embed_id,) = inst.resources.physical_embeds([embed])
        return Call(p.NextDistItem(embed_id, top_k), reads=frozenset({Embed(embed_id)}))
    return issue(inst, q, "next_dist", f.DISTS, build)


def forward_text(inst, q, tokens, positions, pages, last_page_len, output_indices, top_k, adapter) -> int:
    def build():
        adapter_id = _adapter_id(inst, adapter)
        page_ids = inst.resources.physical_pages(pages)
        item = p.ForwardTextItem(list(tokens), list(positions), page_ids, last_page_len, list(output_indices), top_k,
                                 adapter_id=adapter_id)
        return Call(item, len(tokens), kv_context=_kv_context(inst, page_ids, last_page_len, len(tokens)))
    return issue(inst, q, "forward_text", f.DISTS, build)


FUNCS = {"forward": forward, "get-next-dist": get_next_dist, "forward-text": forward_text}
