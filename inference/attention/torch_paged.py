"""Paged attention in plain PyTorch (``scaled_dot_product_attention``); runs on CPU and CUDA.

Items are grouped so padding stays small: all single-token items (decode
steps) form one group padded to the longest context, and every multi-token
item (prefill) is a group of its own. Each group gathers its K/V from the pages
into a dense ``[G, kv_heads, L, D]`` tensor and calls SDPA with a boolean mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from .base import AttentionBackend, BatchLayout


@dataclass
class _Group:
    q_rows: torch.Tensor  # int64 [G * Lq]: rows of the batch's q that this group computes
    k_rows: torch.Tensor  # int64 [G * Lk]: rows of the layer's flat cache view holding the keys
    allow: torch.Tensor  # bool [G, 1, Lq, Lk]
    empty_rows: torch.Tensor | None  # bool [G, Lq, 1]: queries that may attend to nothing
    shape: tuple[int, int]  # (G, Lq)


class TorchPagedAttention(AttentionBackend):
    name = "torch"

    def plan(self, layout: BatchLayout) -> None:
        self.clear_written_mask_bits(layout)
        device = self.kv_cache.device
        self._write_k_rows = torch.from_numpy(self._k_rows(layout.write_slots)).to(device)
        masks = self.full_masks(layout)
        q_lens = layout.q_lens
        decode = [b for b in range(layout.num_items) if q_lens[b] == 1]
        groups = [decode] if decode else []
        groups += [[b] for b in range(layout.num_items) if q_lens[b] != 1]
        self._groups = [self._plan_group(layout, masks, items, device) for items in groups]

    def _plan_group(self, layout: BatchLayout, masks: list[np.ndarray], items: list[int], device) -> _Group:
        num_q = int(layout.q_lens[items[0]])  # groups have one query length
        num_kv = int(max(layout.kv_lens[b] for b in items))
        slots = np.zeros((len(items), num_kv), dtype=np.int64)
        allow = np.zeros((len(items), 1, num_q, num_kv), dtype=bool)
        for g, b in enumerate(items):
            kv_len = int(layout.kv_lens[b])
            slots[g, :kv_len] = layout.item_slots(b)
            allow[g, 0, :, :kv_len] = masks[b]
        q_rows = np.concatenate([np.arange(layout.qo_indptr[b], layout.qo_indptr[b + 1]) for b in items])
        empty = ~allow.any(axis=-1)  # [G, 1, Lq]
        empty_rows = None
        if empty.any():
            # SDPA returns NaN for a row with nothing to attend to; let it see slot 0, then zero it.
            allow[..., 0] |= empty
            empty_rows = torch.from_numpy(empty[:, 0, :, None]).to(device)
        return _Group(
            q_rows=torch.from_numpy(q_rows).to(device),
            k_rows=torch.from_numpy(self._k_rows(slots.reshape(-1))).to(device),
            allow=torch.from_numpy(allow).to(device),
            empty_rows=empty_rows,
            shape=(len(items), num_q),
        )

    def _k_rows(self, slots: np.ndarray) -> np.ndarray:
        """Flat slots -> rows of ``cache.view(-1, kv_heads, D)`` holding K (V is ``page_size`` rows on)."""
        pages, offsets = np.divmod(slots, self.page_size)
        return pages * 2 * self.page_size + offsets

    def run(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # One flat row per (page, K/V, offset): index_select/index_copy_ on single int64 indices
        # are several times faster than advanced indexing with (page, offset) pairs.
        rows = self.kv_cache[layer_idx].view(-1, self.num_kv_heads, self.head_dim)
        rows.index_copy_(0, self._write_k_rows, k)
        rows.index_copy_(0, self._write_k_rows + self.page_size, v)
        out = torch.empty_like(q)
        for group in self._groups:
            num_groups, num_q = group.shape
            q_g = q[group.q_rows].view(num_groups, num_q, self.num_q_heads, self.head_dim).transpose(1, 2)
            k_g = rows.index_select(0, group.k_rows).view(num_groups, -1, self.num_kv_heads, self.head_dim)
            v_g = rows.index_select(0, group.k_rows + self.page_size).view_as(k_g)
            o = self._sdpa(q_g, k_g.transpose(1, 2), v_g.transpose(1, 2), group.allow)
            o = o.transpose(1, 2)  # [G, Lq, q_heads, D]
            if group.empty_rows is not None:
                o = o.masked_fill(group.empty_rows[..., None], 0.0)
            out[group.q_rows] = o.reshape(num_groups * num_q, self.num_q_heads, self.head_dim)
        return out

    @staticmethod
    def _sdpa(q, k, v, allow) -> torch.Tensor:
        if q.is_cuda or q.dtype == torch.float32:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=allow, enable_gqa=True)
        # CPU SDPA in bf16/fp16 is several times slower than in float32 (measured in bench/).
        return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=allow,
                                              enable_gqa=True).to(q.dtype)
