"""``forward``: the forward pass, next-token distributions, the fused forward-text path, and the
decode step whose token the inference process draws (``forward-sample``, a token future)."""

from __future__ import annotations

import array
import sys

from oven.control.resources.slab import ResourceError
from oven.control.scheduling.footprint import Embed, TokenSlot
from oven.proto import inference as p

from .. import futures as f
from .issue import Call, check_kv_writes, issue


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
        check_kv_writes(inst, page_ids, last_page_len, len(inputs))
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
        check_kv_writes(inst, page_ids, last_page_len, len(tokens))
        item = p.ForwardTextItem(list(tokens), list(positions), page_ids, last_page_len, list(output_indices), top_k,
                                 adapter_id=adapter_id)
        return Call(item, len(tokens), kv_context=_kv_context(inst, page_ids, last_page_len, len(tokens)))
    return issue(inst, q, "forward_text", f.DISTS, build)


# WIT's sampler-kind cases (as wasmtime-py lifts them) -> the inference protocol's sampler names.
SAMPLE_KIND_BY_WIT = {"greedy": p.SAMPLE_GREEDY, "temperature": p.SAMPLE_TEMPERATURE, "top-k": p.SAMPLE_TOP_K,
                      "top-p": p.SAMPLE_TOP_P, "min-p": p.SAMPLE_MIN_P}


def forward_sample(inst, q, tokens, input_futures, positions, pages, last_page_len, top_k, adapter, sampler,
                   temperature, param, rng_state, shaping=None) -> int:
    """A token future: its slot is held by this command and by every command it feeds until they settle
    (see ``token_slots``), as is its decoder (see ``decoders``); a bad handle or a failed input future
    fails it at once."""
    fut = inst.futures.create(f.TOKEN)
    slots, held = inst.host.calls.token_slots, []
    decoder = None

    def release(done) -> None:
        for slot in held:
            slots.release(slot)
        if decoder is not None:
            inst.host.calls.decoder_ids.release(decoder, done.error is None)

    try:
        adapter_id = _adapter_id(inst, adapter)
        page_ids = inst.resources.physical_pages(pages)
        check_kv_writes(inst, page_ids, last_page_len, len(tokens))
        token_ids, token_futures = _inputs(inst, tokens, input_futures, held)
        shape = None
        if shaping is not None:
            shape, decoder = _shape(inst, shaping)
    except (ResourceError, ValueError) as exc:
        for slot in held:
            slots.release(slot)
        inst.futures.fail(fut, str(exc))
        return fut.handle
    fut.token_slot = slots.allocate()
    held.append(fut.token_slot)
    fut.callbacks.append(release)
    item = p.ForwardTextItem(token_ids, list(positions), page_ids, last_page_len, [len(tokens) - 1], top_k,
                             adapter_id=adapter_id, token_futures=token_futures,
                             sample=p.SampleSpec(fut.token_slot, SAMPLE_KIND_BY_WIT[sampler], temperature, param,
                                                 rng_state, shape))
    inst.host.calls.submit(inst, q, "forward_text", item, fut, num_tokens=len(tokens),
                           reads=frozenset(TokenSlot(s) for s in held[:-1]),
                           writes=frozenset({TokenSlot(fut.token_slot)}),
                           kv_context=_kv_context(inst, page_ids, last_page_len, len(tokens)))
    return fut.handle


def forward_sample_shaped(inst, q, tokens, input_futures, positions, pages, last_page_len, top_k, adapter, sampler,
                          temperature, param, rng_state, shaping) -> int:
    return forward_sample(inst, q, tokens, input_futures, positions, pages, last_page_len, top_k, adapter, sampler,
                          temperature, param, rng_state, shaping)


def _shape(inst, shaping: dict):
    """The item's ShapeSpec and the decoder it names (None); ValueError for a decoder this instance does
    not hold or one lost with an earlier inference process (the decoder is then held by the command)."""
    decoder = decoder_id = None
    spec = None
    if shaping["decoder"]:
        decoder = inst.decoders.get(shaping["decoder"])
        if decoder is None:
            raise ValueError(f"decoder {shaping['decoder']} is not held by this inferlet")
        decoder_id, spec = inst.host.calls.decoder_ids.shape_for(decoder)
    bias_ids, bias_values = shaping["bias-tokens"], shaping["bias-values"]
    vocab_size = inst.host.info.vocab_size
    problem = (f"shaping has {len(bias_ids)} bias tokens and {len(bias_values)} bias values"
               if len(bias_ids) != len(bias_values) else
               f"bias token {max(bias_ids)} is outside the vocabulary of {vocab_size}"
               if bias_ids and max(bias_ids) >= vocab_size else None)
    if problem is not None:
        if decoder is not None:
            inst.host.calls.decoder_ids.release(decoder, False)
        raise ValueError(problem)
    shape = p.ShapeSpec(bytes(shaping["allowed"]) or None, _little("i", bias_ids), _little("f", bias_values),
                        -1 if decoder is None else decoder_id, spec, shaping["logprobs"])
    return shape, decoder


def _little(code: str, values: list) -> bytes:
    """int32 or float32 little-endian, as proto/inference.py's byte fields are."""
    packed = array.array(code, values)
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tobytes()


def _inputs(inst, tokens: list[int], input_futures: list[int], held: list[int]) -> tuple[list[int], list[int] | None]:
    """The item's tokens and ``token_futures``: a completed input future becomes its token, a pending
    one its slot (held in ``held``); ResourceError for a handle that is no token future of this
    instance or one that failed."""
    if not input_futures:
        return list(tokens), None
    if len(input_futures) != len(tokens):
        raise ResourceError(f"input-futures has {len(input_futures)} entries for {len(tokens)} tokens")
    token_ids, token_futures = list(tokens), [-1] * len(tokens)
    for i, handle in enumerate(input_futures):
        if handle == 0:
            continue
        if not inst.futures.is_known(handle) or (source := inst.futures.get(handle)).kind != f.TOKEN:
            raise ResourceError(f"input future {handle} is not a token future of this inferlet")
        if source.error is not None:
            raise ResourceError(f"input token future {handle} failed: {source.error}")
        if source.done:
            token_ids[i] = f.token_of(source.value)
        else:
            inst.host.calls.token_slots.hold(source.token_slot)
            held.append(source.token_slot)
            token_ids[i], token_futures[i] = 0, source.token_slot
    return token_ids, token_futures if any(s != -1 for s in token_futures) else None


FUNCS = {"forward": forward, "get-next-dist": get_next_dist, "forward-text": forward_text,
         "forward-sample": forward_sample, "forward-sample-shaped": forward_sample_shaped}
