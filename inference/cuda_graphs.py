"""Decode steps as CUDA graphs: the whole model forward replayed by one launch instead of ~10 Python-issued
kernels per layer (as vLLM and SGLang do).

A batch of B single-token items, nothing masked and no adapter, is padded to
the next bucket size (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, ... up to
``max_batch``) and replays that bucket's graph. A bucket's graph is captured at
its first use: FlashInfer's decode wrapper in CUDA-graph mode over static page
table buffers (:class:`~.attention.flashinfer_paged.GraphDecodeAttention`),
static input rows and positions, the model's forward recorded once. Before each
replay the host re-plans the wrapper (its buffers' contents change, their
addresses do not) and copies the inputs in; the padding rows attend to, and
write their K/V into, the pool's scratch page, which no item can name.

Batches with adapters run eagerly (the LoRA executor's segments change from
batch to batch), as do prefill and masked batches. The graph's output rows are
static: they are valid until the next replay of that bucket, so callers consume
them before the next forward (the engine does).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch

from .attention.base import BatchLayout

log = logging.getLogger(__name__)

WARMUP_RUNS = 2  # eager runs before capture: JIT-loads FlashInfer's modules, sizes cuBLAS workspaces


def bucket_sizes(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then every 8 to 32, every 16 to 64, every 32 beyond; the last is ``max_batch``."""
    sizes, size = [], 1
    while size < max_batch:
        sizes.append(size)
        size = size * 2 if size < 8 else size + (8 if size < 32 else 16 if size < 64 else 32)
    return sizes + [max_batch]


def padded_layout(layout: BatchLayout, batch_size: int, scratch_page: int) -> BatchLayout:
    """``layout`` (single-token items) plus rows up to ``batch_size`` that hold one token in ``scratch_page``."""
    pad = batch_size - layout.num_items
    if pad == 0:
        return layout
    q_lens = np.concatenate([layout.q_lens, np.ones(pad, dtype=np.int64)])
    kv_counts = np.concatenate([np.diff(layout.kv_indptr), np.ones(pad, dtype=np.int64)])
    padded = BatchLayout(
        page_size=layout.page_size,
        qo_indptr=np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32),
        kv_indptr=np.concatenate([[0], np.cumsum(kv_counts)]).astype(np.int32),
        kv_page_ids=np.concatenate([layout.kv_page_ids, np.full(pad, scratch_page, dtype=np.int32)]),
        kv_last_page_len=np.concatenate([layout.kv_last_page_len, np.ones(pad, dtype=np.int32)]),
        kv_lens=np.concatenate([layout.kv_lens, np.ones(pad, dtype=np.int64)]),
        write_slots=np.concatenate([layout.write_slots,
                                    np.full(pad, scratch_page * layout.page_size, dtype=np.int64)]),
        user_masks=layout.user_masks + [None] * pad,
    )
    return padded


@dataclass
class _Graph:
    attention: object  # GraphDecodeAttention
    hidden: torch.Tensor  # [bucket, H] static input rows
    positions: torch.Tensor  # int64 [bucket]
    out: torch.Tensor  # [bucket, H] static output rows
    graph: torch.cuda.CUDAGraph


class DecodeGraphs:
    """CUDA graphs of ``model``'s forward for decode batches, one per bucket size, over a FlashInfer backend."""

    def __init__(self, model, backend, scratch_page: int, num_pages: int, max_batch: int):
        self.model, self.backend = model, backend
        self.scratch_page, self.max_pages = scratch_page, num_pages + max_batch
        self.buckets = np.array(bucket_sizes(max_batch))
        self.graphs: dict[int, _Graph] = {}

    def accepts(self, layout: BatchLayout) -> bool:
        """A decode batch that fits a bucket and the static page table (items that share pages list them
        once each), and needs no custom mask (the batch's own write slots count as visible, as every plan
        makes them)."""
        if layout.num_items > self.buckets[-1] or not bool((layout.q_lens == 1).all()):
            return False
        if len(layout.kv_page_ids) + self.buckets[-1] > self.max_pages:
            return False
        self.backend.clear_written_mask_bits(layout)
        return not self.backend.needs_custom_mask(layout)

    @torch.inference_mode()
    def run(self, hidden: torch.Tensor, positions: torch.Tensor, layout: BatchLayout) -> torch.Tensor:
        """hidden [B, H] and int64 positions [B] of an accepted batch -> final hidden states [B, H]
        (rows of the bucket's static output: valid until its next replay)."""
        num = layout.num_items
        bucket = int(self.buckets[np.searchsorted(self.buckets, num)])
        entry = self.graphs.get(bucket) or self._capture(bucket, hidden)
        entry.attention.plan(padded_layout(layout, bucket, self.scratch_page))
        entry.hidden[:num].copy_(hidden)
        entry.positions[:num].copy_(positions)
        entry.graph.replay()
        return entry.out[:num]

    def _capture(self, bucket: int, like: torch.Tensor) -> _Graph:
        from .attention.flashinfer_paged import GraphDecodeAttention

        log.info("capturing the CUDA graph of decode batches of %d", bucket)
        attention = GraphDecodeAttention(self.backend, bucket, self.max_pages)
        empty = BatchLayout.build(self.backend.page_size, [])
        attention.plan(padded_layout(empty, bucket, self.scratch_page))  # every row on the scratch page
        hidden = torch.zeros((bucket, like.shape[1]), dtype=like.dtype, device=like.device)
        positions = torch.zeros(bucket, dtype=torch.long, device=like.device)
        side = torch.cuda.Stream(like.device)
        side.wait_stream(torch.cuda.current_stream(like.device))
        with torch.cuda.stream(side):
            for _ in range(WARMUP_RUNS):
                self.model(hidden, positions, attention)
        torch.cuda.current_stream(like.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = self.model(hidden, positions, attention)
        entry = _Graph(attention, hidden, positions, out, graph)
        self.graphs[bucket] = entry
        return entry
