"""Paged attention with FlashInfer kernels (CUDA only; imported lazily by make_backend).

Per batch, :meth:`FlashInferPagedAttention.plan` picks one of three wrappers
(see :mod:`.flashinfer_plan`): decode, causal prefill (backend ``auto``, fa3 on
Hopper), or masked prefill (backend fixed to fa2, which takes custom masks).
Per layer, :meth:`run` appends the batch's K/V with ``append_paged_kv_cache``
and runs the planned wrapper on that layer's cache (layout NHD: each layer is
``[pages, 2, page_size, kv_heads, head_dim]``).

Planning never waits for the device: the page table goes to ``plan()`` as
pinned host tensors (``plan()`` reads them on the host and uploads them itself),
the append indices go up in one asynchronous copy, and masks are packed on the
host. :class:`GraphDecodeAttention` is the same decode attention over static
buffers, for CUDA graphs.
"""

from __future__ import annotations

import numpy as np
import torch

import flashinfer

from ..transfer import pinned, to_device, to_device_many
from .base import AttentionBackend, BatchLayout
from .flashinfer_plan import CAUSAL, DECODE, MASKED, append_rows, packed_masks, plan_kind

PREFILL_WORKSPACE_BYTES = 128 << 20  # FlashInfer's recommended size
DECODE_WORKSPACE_BYTES = 128 << 20


class FlashInferPagedAttention(AttentionBackend):
    name = "flashinfer"

    def __init__(self, kv_cache: torch.Tensor, page_mask: torch.Tensor, num_q_heads: int):
        super().__init__(kv_cache, page_mask, num_q_heads)
        device = kv_cache.device
        prefill_workspace = torch.empty(PREFILL_WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        # The decode wrapper's workspace "must be initialized to 0 for its first use" (its docstring), so
        # decode wrappers get their own, zeroed, which no prefill scribbles on.
        self.decode_workspace = torch.zeros(DECODE_WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self.use_tensor_cores = num_q_heads // self.num_kv_heads >= 4
        self._wrappers = {
            DECODE: flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                self.decode_workspace, "NHD", use_tensor_cores=self.use_tensor_cores),
            CAUSAL: flashinfer.BatchPrefillWithPagedKVCacheWrapper(prefill_workspace, "NHD"),
            MASKED: flashinfer.BatchPrefillWithPagedKVCacheWrapper(prefill_workspace, "NHD", backend="fa2"),
        }
        self._wrapper = None
        self.planned_kind: str | None = None

    @property
    def plan_shape(self) -> tuple[int, int, int, int]:
        return self.num_q_heads, self.num_kv_heads, self.head_dim, self.page_size

    def plan(self, layout: BatchLayout) -> None:
        self.clear_written_mask_bits(layout)
        kind = plan_kind(layout, self.needs_custom_mask(layout))
        dtype = self.kv_cache.dtype
        kv_indptr, kv_indices, kv_last = (pinned(a) for a in (layout.kv_indptr, layout.kv_page_ids,
                                                               layout.kv_last_page_len))
        batch_indices, positions = append_rows(layout)
        self._append_args = tuple(to_device_many(
            [batch_indices, positions, layout.kv_page_ids, layout.kv_indptr, layout.kv_last_page_len],
            np.int32, self.kv_cache.device))
        wrapper = self._wrappers[kind]
        if kind == DECODE:
            wrapper.plan(kv_indptr, kv_indices, kv_last, *self.plan_shape, pos_encoding_mode="NONE",
                         q_data_type=dtype, kv_data_type=dtype)
        else:
            mask = pinned(packed_masks(self.full_masks(layout))) if kind == MASKED else None
            wrapper.plan(pinned(layout.qo_indptr), kv_indptr, kv_indices, kv_last, *self.plan_shape,
                         packed_custom_mask=mask, causal=kind == CAUSAL, q_data_type=dtype, kv_data_type=dtype)
        self._wrapper, self.planned_kind = wrapper, kind

    def run(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        cache = self.kv_cache[layer_idx]
        flashinfer.append_paged_kv_cache(k, v, *self._append_args[:2], cache, *self._append_args[2:],
                                         kv_layout="NHD")
        return self._wrapper.run(q, cache)


class GraphDecodeAttention(AttentionBackend):
    """Decode attention for exactly ``batch_size`` single-token items over static device buffers, so a
    CUDA graph captured around :meth:`run` stays valid: :meth:`plan` rewrites the buffers' contents
    (FlashInfer's wrapper in CUDA-graph mode copies the page table into them) and never their addresses.

    ``plan`` takes a layout of exactly ``batch_size`` decode items whose pages fit ``max_pages``.
    """

    name = "flashinfer-graph"

    def __init__(self, backend: FlashInferPagedAttention, batch_size: int, max_pages: int):
        super().__init__(backend.kv_cache, backend.page_mask, backend.num_q_heads)
        device = self.kv_cache.device
        self.batch_size = batch_size
        self.plan_shape = backend.plan_shape
        self.kv_indptr = torch.zeros(batch_size + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(max_pages, dtype=torch.int32, device=device)
        self.kv_last = torch.ones(batch_size, dtype=torch.int32, device=device)
        self.batch_indices = torch.arange(batch_size, dtype=torch.int32, device=device)
        self.positions = torch.zeros(batch_size, dtype=torch.int32, device=device)
        self.wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            backend.decode_workspace, "NHD", use_cuda_graph=True, use_tensor_cores=backend.use_tensor_cores,
            paged_kv_indptr_buffer=self.kv_indptr, paged_kv_indices_buffer=self.kv_indices,
            paged_kv_last_page_len_buffer=self.kv_last)

    def plan(self, layout: BatchLayout) -> None:
        self.clear_written_mask_bits(layout)
        dtype = self.kv_cache.dtype
        # In CUDA-graph mode plan() copies host page ids into its buffer with a blocking copy (it
        # passes non_blocking only for device tensors), so the page ids go up first, asynchronously.
        kv_indices = to_device(layout.kv_page_ids, self.kv_cache.device)  # int32
        self.wrapper.plan(pinned(layout.kv_indptr), kv_indices, pinned(layout.kv_last_page_len),
                          *self.plan_shape, pos_encoding_mode="NONE", q_data_type=dtype, kv_data_type=dtype)
        self.positions.copy_(pinned(append_rows(layout)[1]), non_blocking=True)

    def run(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        cache = self.kv_cache[layer_idx]
        flashinfer.append_paged_kv_cache(k, v, self.batch_indices, self.positions, cache, self.kv_indices,
                                         self.kv_indptr, self.kv_last, kv_layout="NHD")
        return self.wrapper.run(q, cache)
