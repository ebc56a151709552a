"""The inference layer's memory: KvPage pool, Embed pool and the host tier for offloaded pages.

Pure storage addressed by physical ids. Which id belongs to whom is the control
layer's business; nothing here allocates or frees.
"""

from __future__ import annotations

import numpy as np
import torch

from .config import ModelConfig


class KvPagePool:
    """``kv_cache`` [layers, pages, 2, page_size, kv_heads, head_dim] (K at 0, V at 1), and
    ``page_mask`` bool [pages, page_size]: True hides that token slot from attention.

    ``page_mask`` always lives in host memory: attention masks are planned on the CPU,
    so reading it never waits for the device.
    """

    def __init__(self, cfg: ModelConfig, num_pages: int, page_size: int, dtype: torch.dtype, device: torch.device):
        self.num_pages, self.page_size = num_pages, page_size
        shape = (cfg.num_layers, num_pages, 2, page_size, cfg.num_kv_heads, cfg.head_dim)
        self.kv_cache = torch.zeros(shape, dtype=dtype, device=device)
        self.page_mask = torch.zeros((num_pages, page_size), dtype=torch.bool)

    def copy_tokens(self, src_page: int, dst_page: int, src_offset: int, dst_offset: int, num_tokens: int) -> None:
        """Copy K, V (every layer) and mask bits of a token range; overlapping ranges are safe."""
        src = slice(src_offset, src_offset + num_tokens)
        dst = slice(dst_offset, dst_offset + num_tokens)
        self.kv_cache[:, dst_page, :, dst] = self.kv_cache[:, src_page, :, src].clone()
        self.page_mask[dst_page, dst] = self.page_mask[src_page, src].clone()

    def set_mask(self, page_ids: list[int], masked: list[list[bool]]) -> None:
        self.page_mask[torch.tensor(page_ids, dtype=torch.long)] = torch.tensor(masked, dtype=torch.bool)


class EmbedPool:
    """``embeds`` [num_embeds, hidden] and their int64 ``positions``; ``written`` marks slots ever filled."""

    def __init__(self, num_embeds: int, hidden_size: int, dtype: torch.dtype, device: torch.device):
        self.num_embeds = num_embeds
        self.embeds = torch.zeros((num_embeds, hidden_size), dtype=dtype, device=device)
        self.positions = torch.zeros(num_embeds, dtype=torch.long, device=device)
        self.written = np.zeros(num_embeds, dtype=bool)  # host-side, so validation never touches the device

    def store(self, embed_ids: list[int], values: torch.Tensor, positions: torch.Tensor) -> None:
        """values [n, hidden] and int64 positions [n] into slots ``embed_ids`` (a later duplicate wins)."""
        ids = torch.tensor(embed_ids, dtype=torch.long, device=self.embeds.device)
        self.embeds[ids] = values
        self.positions[ids] = positions
        self.written[embed_ids] = True


class HostKvTier:
    """Host-memory copies of pages (pinned on CUDA so copies run at full PCIe speed).

    Laid out like the device pool, ``[layers, slots, 2, page_size, kv_heads, head_dim]``,
    with its own ``slot_mask``; ``occupied`` marks slots holding an offloaded page.
    """

    def __init__(self, pool: KvPagePool, num_slots: int):
        self.pool, self.num_slots = pool, num_slots
        pin = pool.kv_cache.is_cuda
        shape = (pool.kv_cache.shape[0], num_slots, *pool.kv_cache.shape[2:])
        self.kv_cache = torch.zeros(shape, dtype=pool.kv_cache.dtype, pin_memory=pin)
        self.slot_mask = torch.zeros((num_slots, pool.page_size), dtype=torch.bool)
        self.occupied = torch.zeros(num_slots, dtype=torch.bool)

    def offload(self, page_ids: list[int], slot_ids: list[int]) -> None:
        pages, slots = torch.tensor(page_ids, dtype=torch.long), torch.tensor(slot_ids, dtype=torch.long)
        self.kv_cache[:, slots] = self.pool.kv_cache[:, pages.to(self.pool.kv_cache.device)].cpu()
        self.slot_mask[slots] = self.pool.page_mask[pages]
        self.occupied[slots] = True

    def restore(self, slot_ids: list[int], page_ids: list[int]) -> None:
        pages, slots = torch.tensor(page_ids, dtype=torch.long), torch.tensor(slot_ids, dtype=torch.long)
        device = self.pool.kv_cache.device
        self.pool.kv_cache[:, pages.to(device)] = self.kv_cache[:, slots].to(device)
        self.pool.page_mask[pages] = self.slot_mask[slots]
