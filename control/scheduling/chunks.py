"""Chunked prefill: a forward of many tokens split into forwards of at most ``chunk_tokens`` each.

One forward is one batch's worth of device time, and every instance whose decode step shares that
batch waits for all of it: a prompt of 8,000 tokens stalls everybody's next token for as long as its
prefill takes (a minute for SmolLM2 on one CPU core). Split, its chunks go out in turn through the
same queue, each in a batch of its own bounded size, and other instances' decode steps join each of
those batches (Sarathi-Serve's chunked prefill; vLLM's ``--enable-chunked-prefill``).

A chunk covers input tokens ``[a, b)`` of the call: its context is the call's context cut after
token ``b`` (the pages up to there, the last one filled that far), its rows of the attention mask are
cut to that context, and it keeps the outputs that fall in it. Attention is causal, so each token
sees exactly what it would have seen in the whole forward: the chunks before it wrote their K/V
first (the queue keeps their order; chunks of one call that share a batch are vertical batching,
which writes every item's K/V before any item attends). A sample goes with the chunk holding the
call's last output, as does a grammar or log-probabilities it carries.

Pure functions: :class:`~oven.control.runtime.calls.InferenceCalls` splits, queues the chunks and
gathers their results into the call's one future; each replica sizes its chunks and batches with
:func:`chunk_budget`.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, NamedTuple

from .footprint import Embed, Resource, TokenSlot

if TYPE_CHECKING:  # not imported at run time: the CLI reads AUTO through the control settings
    from oven.proto import inference as p

__all__ = ["AUTO", "Chunk", "chunk_budget", "split_forward"]

AUTO = -1  # the prefill_chunk_tokens setting that sizes chunks by the device
# A chunk's forward is what a decode step beside it waits for: on a CPU 128 tokens of SmolLM2-135M take
# about a quarter of a second (bench/chunked_prefill.py); a GPU needs thousands of tokens in a batch to
# forward them at full speed, and forwards 2048 of a 1B model in milliseconds.
AUTO_CHUNK_TOKENS = {"cpu": 128, "cuda": 2048}


def chunk_budget(setting: int, device: str, max_batch_tokens: int) -> tuple[int, int]:
    """(chunk size, tokens one batch may hold) for the ``prefill_chunk_tokens`` setting (``AUTO``: by
    ``device``, the inference process's; 0: no chunks) and the process's ``max_batch_tokens``: batches
    hold two chunks' worth, the rest of a batch beside one chunk being decode steps or another prompt's
    chunk."""
    if setting == AUTO:
        setting = AUTO_CHUNK_TOKENS["cuda" if device.startswith("cuda") else "cpu"]
    chunk = min(setting, max_batch_tokens)
    return chunk, min(2 * chunk, max_batch_tokens) if chunk else max_batch_tokens


class Chunk(NamedTuple):
    """One chunk of a split forward: its item and what its command names (as ``Command``), and
    ``outputs``: where its outputs sit among the call's (``output_indices`` positions)."""

    item: p.ForwardItem | p.ForwardTextItem
    num_tokens: int
    reads: frozenset[Resource]
    writes: frozenset[Resource]
    kv_context: tuple[list[int], int, int, int]
    outputs: list[int]


def split_forward(item: p.ForwardItem | p.ForwardTextItem, page_size: int,
                  chunk_tokens: int) -> list[Chunk] | None:
    """``item``'s inputs in chunks of ``chunk_tokens`` (at least 1; the last chunk may hold fewer), in
    order; None for an item whose context, outputs or mask do not fit its inputs: sent whole, it fails
    with the inference process's exact words for what is wrong."""
    text = hasattr(item, "token_ids")  # a ForwardTextItem; a ForwardItem's inputs are embeds
    num_inputs = len(item.token_ids if text else item.input_embed_ids)
    if not _well_formed(item, num_inputs, page_size):
        return None
    base = (len(item.kv_page_ids) - 1) * page_size + item.kv_last_page_len - num_inputs  # context before them
    outputs_of: list[list[int]] = [[] for _ in range(0, num_inputs, chunk_tokens)]  # chunk -> its outputs
    for j, index in enumerate(item.output_indices):
        outputs_of[index // chunk_tokens].append(j)
    chunks = []
    for k, outputs in enumerate(outputs_of):
        start, stop = k * chunk_tokens, min((k + 1) * chunk_tokens, num_inputs)
        context = base + stop  # the chunk's context ends after its last input
        pages = item.kv_page_ids[:(context + page_size - 1) // page_size]
        last_page_len = context - (len(pages) - 1) * page_size
        mask = None if item.attention_mask is None else [row[:(context + 7) // 8] for row in
                                                         item.attention_mask[start:stop]]
        common = dict(kv_page_ids=pages, kv_last_page_len=last_page_len, attention_mask=mask,
                      output_indices=[item.output_indices[j] - start for j in outputs])
        if text:
            futures = None if item.token_futures is None else item.token_futures[start:stop]
            if futures is not None and all(s == -1 for s in futures):
                futures = None
            sample = item.sample if outputs and outputs[-1] == len(item.output_indices) - 1 else None
            chunk = dataclasses.replace(item, token_ids=item.token_ids[start:stop],
                                        positions=item.positions[start:stop], token_futures=futures, sample=sample,
                                        **common)
            reads = frozenset(TokenSlot(s) for s in futures or () if s != -1)
            writes = frozenset({TokenSlot(sample.future_id)}) if sample is not None else frozenset()
        else:
            chunk = dataclasses.replace(item, input_embed_ids=item.input_embed_ids[start:stop],
                                        output_embed_ids=[item.output_embed_ids[j] for j in outputs], **common)
            reads = frozenset(Embed(e) for e in chunk.input_embed_ids)
            writes = frozenset(Embed(e) for e in chunk.output_embed_ids)
        chunks.append(Chunk(chunk, stop - start, reads, writes, (pages, last_page_len, stop - start, page_size),
                            outputs))
    return chunks


def _well_formed(item, num_inputs: int, page_size: int) -> bool:
    """Whether ``item``'s context holds its inputs, its outputs index them, and its mask has a row per
    input as long as the context."""
    if not item.kv_page_ids or not 1 <= item.kv_last_page_len <= page_size:
        return False
    kv_len = (len(item.kv_page_ids) - 1) * page_size + item.kv_last_page_len
    mask = item.attention_mask
    return (num_inputs <= kv_len and all(0 <= index < num_inputs for index in item.output_indices)
            and (mask is None or len(mask) == num_inputs and all(len(row) == (kv_len + 7) // 8 for row in mask)))
