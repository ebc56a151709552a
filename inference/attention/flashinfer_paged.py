"""Paged attention with FlashInfer kernels (CUDA only; imported lazily by make_backend).

Per batch, :meth:`plan` picks one wrapper:

* all items are single-token and nothing is masked -> ``BatchDecodeWithPagedKVCacheWrapper``;
* otherwise ``BatchPrefillWithPagedKVCacheWrapper``, causal, or with a custom
  mask (causal AND user mask AND NOT page mask) when any item needs one.

Per layer, :meth:`run` appends the batch's K/V with ``append_paged_kv_cache``
and runs the planned wrapper on that layer's cache (layout NHD: each layer is
``[pages, 2, page_size, kv_heads, head_dim]``).
"""

from __future__ import annotations

import numpy as np
import torch

import flashinfer

from .base import AttentionBackend, BatchLayout

WORKSPACE_BYTES = 256 << 20


class FlashInferPagedAttention(AttentionBackend):
    name = "flashinfer"

    def __init__(self, kv_cache: torch.Tensor, page_mask: torch.Tensor, num_q_heads: int):
        super().__init__(kv_cache, page_mask, num_q_heads)
        device = kv_cache.device
        workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self._prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
        self._decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            workspace, "NHD", use_tensor_cores=num_q_heads // self.num_kv_heads >= 4)
        self._wrapper = None

    def plan(self, layout: BatchLayout) -> None:
        self.clear_written_mask_bits(layout)
        device = self.kv_cache.device

        def dev(a: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int32)).to(device, non_blocking=True)

        qo_indptr, kv_indptr = dev(layout.qo_indptr), dev(layout.kv_indptr)
        kv_indices, kv_last = dev(layout.kv_page_ids), dev(layout.kv_last_page_len)
        kv_lens = dev(layout.kv_lens)
        num_tokens = int(layout.qo_indptr[-1])
        self._append_args = (
            *flashinfer.get_batch_indices_positions(qo_indptr, kv_lens, num_tokens),
            kv_indices, kv_indptr, kv_last,
        )
        dtype = self.kv_cache.dtype
        shape = (self.num_q_heads, self.num_kv_heads, self.head_dim, self.page_size)
        custom = self.needs_custom_mask(layout)
        if not custom and bool((layout.q_lens == 1).all()):
            self._decode.plan(kv_indptr, kv_indices, kv_last, *shape,
                              pos_encoding_mode="NONE", q_data_type=dtype, kv_data_type=dtype)
            self._wrapper = self._decode
            return
        mask = None
        if custom:
            mask = torch.from_numpy(np.concatenate([m.reshape(-1) for m in self.full_masks(layout)])).to(device)
        self._prefill.plan(qo_indptr, kv_indptr, kv_indices, kv_last, *shape,
                           custom_mask=mask, causal=not custom, q_data_type=dtype, kv_data_type=dtype)
        self._wrapper = self._prefill

    def run(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        cache = self.kv_cache[layer_idx]
        batch_indices, positions, kv_indices, kv_indptr, kv_last = self._append_args
        flashinfer.append_paged_kv_cache(k, v, batch_indices, positions, cache,
                                         kv_indices, kv_indptr, kv_last, kv_layout="NHD")
        return self._wrapper.run(q, cache)
