"""What every attention backend shares: the batch's page table and the plan/run contract.

A forward batch is B items; item b has ``q_lens[b]`` new tokens that are the
last tokens of its paged context of ``kv_lens[b]`` tokens. The layout is built
once per batch on the CPU (numpy), then each backend turns it into device state
in :meth:`AttentionBackend.plan` and reuses that state for every layer in
:meth:`AttentionBackend.run`, FlashInfer style.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch


@dataclass
class BatchLayout:
    """Page table of one forward batch (all int arrays int32 unless noted).

    * ``qo_indptr`` [B+1]: item b's tokens are rows ``qo_indptr[b]:qo_indptr[b+1]`` of q/k/v.
    * ``kv_indptr`` [B+1], ``kv_page_ids`` [sum pages], ``kv_last_page_len`` [B]: FlashInfer's paged table.
    * ``kv_lens`` [B]: context length of each item after the call.
    * ``write_slots`` int64 [N]: flat slot (``page * page_size + offset``) that token n's K/V go to.
    * ``user_masks``: per item None or bool [q_len, kv_len], True = may attend.
    """

    page_size: int
    qo_indptr: np.ndarray
    kv_indptr: np.ndarray
    kv_page_ids: np.ndarray
    kv_last_page_len: np.ndarray
    kv_lens: np.ndarray
    write_slots: np.ndarray
    user_masks: list[np.ndarray | None]

    @property
    def num_items(self) -> int:
        return len(self.kv_lens)

    @cached_property  # a layout's arrays are not changed once built
    def q_lens(self) -> np.ndarray:
        return np.diff(self.qo_indptr)

    @cached_property
    def context_slots(self) -> np.ndarray:
        """int64 flat slots of every item's whole context, item after item, each in context order
        (item b's are ``[ctx_indptr[b], ctx_indptr[b+1])``), in one vectorised pass."""
        page_slots = (self.kv_page_ids.astype(np.int64)[:, None] * self.page_size
                      + np.arange(self.page_size)).reshape(-1)
        ctx_indptr = self.ctx_indptr
        # item b's context is the first kv_lens[b] slots of its pages, which start at kv_indptr[b] pages
        first = self.kv_indptr[:-1].astype(np.int64) * self.page_size
        index = np.repeat(first - ctx_indptr[:-1], self.kv_lens) + np.arange(ctx_indptr[-1])
        return page_slots[index]

    @cached_property
    def ctx_indptr(self) -> np.ndarray:
        """int64 [B+1]: item b's context is ``context_slots[ctx_indptr[b]:ctx_indptr[b+1]]``."""
        return np.concatenate([[0], np.cumsum(self.kv_lens)]).astype(np.int64)

    def item_slots(self, b: int) -> np.ndarray:
        """int64 flat slots of item b's whole context, in context order."""
        ctx_indptr = self.ctx_indptr
        return self.context_slots[ctx_indptr[b]:ctx_indptr[b + 1]]

    @classmethod
    def build(cls, page_size: int, items: list[tuple[list[int], int, int, np.ndarray | None]]) -> "BatchLayout":
        """``items``: (kv_page_ids, kv_last_page_len, num_inputs, user_mask or None), already validated."""
        q_lens = np.array([n for _, _, n, _ in items], dtype=np.int64)
        pages_per_item = [len(p) for p, _, _, _ in items]
        kv_lens = np.array([(len(p) - 1) * page_size + last for p, last, _, _ in items], dtype=np.int64)
        layout = cls(
            page_size=page_size,
            qo_indptr=np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32),
            kv_indptr=np.concatenate([[0], np.cumsum(pages_per_item)]).astype(np.int32),
            kv_page_ids=np.array([p for pages, _, _, _ in items for p in pages], dtype=np.int32),
            kv_last_page_len=np.array([last for _, last, _, _ in items], dtype=np.int32),
            kv_lens=kv_lens,
            write_slots=np.empty(0, dtype=np.int64),
            user_masks=[m for _, _, _, m in items],
        )
        if bool((q_lens == 1).all()):  # decode: each item's one new token is the last of its last page
            pages, offsets = layout.kv_page_ids[layout.kv_indptr[1:] - 1], layout.kv_last_page_len - 1
        else:  # token n of item b sits at context position kv_lens[b] - q_lens[b] + (n - qo_indptr[b])
            position = np.repeat(kv_lens - q_lens - layout.qo_indptr[:-1], q_lens) + np.arange(int(q_lens.sum()))
            pages = layout.kv_page_ids[np.repeat(layout.kv_indptr[:-1], q_lens) + position // page_size]
            offsets = position % page_size
        layout.write_slots = pages.astype(np.int64) * page_size + offsets
        return layout


class AttentionBackend(abc.ABC):
    """Paged attention over a KvPagePool. Plan once per batch, run once per layer.

    The pool's cache is ``[layers, pages, 2, page_size, kv_heads, head_dim]``
    (K at index 0, V at 1) and ``page_mask`` is a host-memory bool tensor
    ``[pages, page_size]`` (True = hidden from attention).
    """

    name: str

    def __init__(self, kv_cache: torch.Tensor, page_mask: torch.Tensor, num_q_heads: int):
        self.kv_cache = kv_cache
        self.page_mask = page_mask
        self.num_q_heads = num_q_heads
        self.num_kv_heads, self.head_dim = kv_cache.shape[-2], kv_cache.shape[-1]
        self.page_size = kv_cache.shape[3]

    @abc.abstractmethod
    def plan(self, layout: BatchLayout) -> None:
        """Prepare device state for ``layout``; clears the page-mask bits of the slots it will write."""

    @abc.abstractmethod
    def run(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Write k/v [N, kv_heads, D] into this layer's pages, then attend q [N, q_heads, D] -> [N, q_heads, D].

        All items' K/V are written before any item attends, so an item may read
        tokens that another item of the same batch writes (vertical batching).
        """

    def full_masks(self, layout: BatchLayout) -> list[np.ndarray]:
        """Per item bool [q_len, kv_len]: causal AND user mask AND NOT page mask.

        Call after :meth:`clear_written_mask_bits`, so the batch's own tokens are visible.
        """
        hidden = self.page_mask.view(-1).numpy()[layout.context_slots]
        masks, start = [], 0
        for b, (q_len, kv_len) in enumerate(zip(layout.q_lens.tolist(), layout.kv_lens.tolist())):
            rows = np.arange(kv_len - q_len, kv_len)[:, None]
            allow = (np.arange(kv_len)[None, :] <= rows) & ~hidden[start:start + kv_len][None, :]
            if layout.user_masks[b] is not None:
                allow &= layout.user_masks[b]
            masks.append(allow)
            start += kv_len
        return masks

    def needs_custom_mask(self, layout: BatchLayout) -> bool:
        """True when some item has a user mask or a masked slot in its context."""
        if any(m is not None for m in layout.user_masks):
            return True
        rows = self.page_mask.numpy()[layout.kv_page_ids]  # the mask rows of the items' pages
        if not rows.any():
            return False
        # cut each row to the slots in use: all of them but on an item's last page
        in_use = np.full(len(layout.kv_page_ids), self.page_size)
        in_use[layout.kv_indptr[1:] - 1] = layout.kv_last_page_len
        return bool((rows & (np.arange(self.page_size) < in_use[:, None])).any())

    def clear_written_mask_bits(self, layout: BatchLayout) -> None:
        """A newly written token is visible: clear the page-mask bits of the batch's write slots."""
        self.page_mask.view(-1).numpy()[layout.write_slots] = False
