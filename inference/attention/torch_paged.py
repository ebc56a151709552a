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
    kv_pages: torch.Tensor  # int64 [G, Lk]
    kv_offsets: torch.Tensor  # int64 [G, Lk]
    allow: torch.Tensor  # bool [G, 1, Lq, Lk]
    empty_rows: torch.Tensor | None  # bool [G, Lq, 1]: queries that may attend to nothing
    shape: tuple[int, int]  # (G, Lq)


class TorchPagedAttention(AttentionBackend):
    name = "torch"

    def plan(self, layout: BatchLayout) -> None:
        self.clear_written_mask_bits(layout)
        device = self.kv_cache.device
        slots = torch.from_numpy(layout.write_slots).to(device)
        self._write_pages, self._write_offsets = slots // self.page_size, slots % self.page_size
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
        slots_t = torch.from_numpy(slots).to(device)
        return _Group(
            q_rows=torch.from_numpy(q_rows).to(device),
            kv_pages=slots_t // self.page_size,
            kv_offsets=slots_t % self.page_size,
            allow=torch.from_numpy(allow).to(device),
            empty_rows=empty_rows,
            shape=(len(items), num_q),
        )

    def run(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        cache = self.kv_cache[layer_idx]  # [pages, 2, page_size, kv_heads, D]
        cache[self._write_pages, 0, self._write_offsets] = k
        cache[self._write_pages, 1, self._write_offsets] = v
        out = torch.empty_like(q)
        for group in self._groups:
            num_groups, num_q = group.shape
            q_g = q[group.q_rows].view(num_groups, num_q, self.num_q_heads, self.head_dim).transpose(1, 2)
            k_g = cache[group.kv_pages, 0, group.kv_offsets].transpose(1, 2)
            v_g = cache[group.kv_pages, 1, group.kv_offsets].transpose(1, 2)
            o = F.scaled_dot_product_attention(q_g, k_g, v_g, attn_mask=group.allow, enable_gqa=True)
            o = o.transpose(1, 2)  # [G, Lq, q_heads, D]
            if group.empty_rows is not None:
                o = o.masked_fill(group.empty_rows[..., None], 0.0)
            out[group.q_rows] = o.reshape(num_groups * num_q, self.num_q_heads, self.head_dim)
        return out
