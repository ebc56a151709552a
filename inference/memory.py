"""The inference layer's memory: KvPage pool, Embed pool and the host tier for offloaded pages.

Pure storage addressed by physical ids. Which id belongs to whom is the control
layer's business; nothing here allocates or frees.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch

from .config import ModelConfig
from .transfer import long_tensor


class KvPagePool:
    """``kv_cache`` [layers, pages + 1, 2, page_size, kv_heads, head_dim] (K at 0, V at 1), and
    ``page_mask`` bool [pages + 1, page_size]: True hides that token slot from attention.

    Page ``scratch_page`` (= ``num_pages``) is no one's: ids are validated below
    ``num_pages``, and the padding rows of a CUDA-graph decode batch write there.
    ``page_mask`` always lives in host memory: attention masks are planned on the CPU,
    so reading it never waits for the device.
    """

    def __init__(self, cfg: ModelConfig, num_pages: int, page_size: int, dtype: torch.dtype, device: torch.device):
        self.num_pages, self.page_size = num_pages, page_size
        self.scratch_page = num_pages
        shape = (cfg.num_layers, num_pages + 1, 2, page_size, cfg.num_kv_heads, cfg.head_dim)
        self.kv_cache = torch.zeros(shape, dtype=dtype, device=device)
        self.page_mask = torch.zeros((num_pages + 1, page_size), dtype=torch.bool)

    def copy_tokens(self, src_page: int, dst_page: int, src_offset: int, dst_offset: int, num_tokens: int) -> None:
        """Copy K, V (every layer) and mask bits of a token range; overlapping ranges are safe."""
        src = slice(src_offset, src_offset + num_tokens)
        dst = slice(dst_offset, dst_offset + num_tokens)
        self.kv_cache[:, dst_page, :, dst] = self.kv_cache[:, src_page, :, src].clone()
        self.page_mask[dst_page, dst] = self.page_mask[src_page, src].clone()

    def set_mask(self, page_ids: list[int], masked: list[list[bool]]) -> None:
        self.page_mask[torch.tensor(page_ids, dtype=torch.long)] = torch.tensor(masked, dtype=torch.bool)


def last_occurrences(ids: list[int]) -> np.ndarray | None:
    """Positions in ``ids`` of the last occurrence of each distinct id, ascending; None when all are distinct."""
    array = np.asarray(ids, dtype=np.int64)
    distinct, first_from_end = np.unique(array[::-1], return_index=True)
    if len(distinct) == len(array):
        return None
    return np.sort(len(array) - 1 - first_from_end)


class EmbedPool:
    """``embeds`` [num_embeds, hidden] and their int64 ``positions``; ``written`` marks slots ever filled."""

    def __init__(self, num_embeds: int, hidden_size: int, dtype: torch.dtype, device: torch.device):
        self.num_embeds = num_embeds
        self.embeds = torch.zeros((num_embeds, hidden_size), dtype=dtype, device=device)
        self.positions = torch.zeros(num_embeds, dtype=torch.long, device=device)
        self.written = np.zeros(num_embeds, dtype=bool)  # host-side, so validation never touches the device

    def store(self, embed_ids: list[int], values: torch.Tensor, positions: torch.Tensor) -> None:
        """values [n, hidden] and int64 positions [n] into slots ``embed_ids``.

        An id named twice gets the row of its last occurrence, on every device: the
        duplicates are dropped on the host first, because an indexed write with
        repeated indices leaves which row lands unspecified on CUDA.
        """
        keep = last_occurrences(embed_ids)
        if keep is not None:
            rows = long_tensor(keep, values.device)
            values, positions = values[rows], positions[rows]
            embed_ids = [embed_ids[i] for i in keep]
        ids = long_tensor(embed_ids, self.embeds.device)
        self.embeds.index_copy_(0, ids, values)
        self.positions.index_copy_(0, ids, positions)
        self.written[embed_ids] = True


class HostKvTier:
    """Host-memory copies of pages: ``kv_cache`` [slots, layers, 2, page_size, kv_heads, head_dim], slot-major
    so each slot is one contiguous block, pinned on CUDA; its own ``slot_mask``; ``occupied`` marks slots
    holding an offloaded page.

    On CUDA the copies run on a side stream, straight between the pinned slots and
    a device staging buffer (one gather or scatter kernel for all the pages of a
    call), and neither call waits for them: each records an event, and
    :meth:`before_use` makes the compute stream wait on the events of the pages it
    is about to touch. A page being offloaded must not be overwritten, and a page
    being restored must not be read, before its copy has run.
    """

    def __init__(self, pool: KvPagePool, num_slots: int):
        self.pool, self.num_slots = pool, num_slots
        cache = pool.kv_cache
        self.on_cuda = cache.is_cuda
        shape = (num_slots, cache.shape[0], *cache.shape[2:])
        self.kv_cache = torch.zeros(shape, dtype=cache.dtype, pin_memory=self.on_cuda)
        self.slot_mask = torch.zeros((num_slots, pool.page_size), dtype=torch.bool)
        self.occupied = torch.zeros(num_slots, dtype=torch.bool)
        self.stream = torch.cuda.Stream(cache.device) if self.on_cuda else None
        self._pending: dict[int, torch.cuda.Event] = {}  # device page -> its last copy

    def offload(self, page_ids: list[int], slot_ids: list[int]) -> None:
        with self._copying(page_ids):
            staged = self.pool.kv_cache[:, long_tensor(page_ids, self.pool.kv_cache.device)].transpose(0, 1)
            staged = staged.contiguous()  # [pages, layers, ...]: each page one block
            for i, slot in enumerate(slot_ids):
                self.kv_cache[slot].copy_(staged[i], non_blocking=True)
        slots = torch.tensor(slot_ids, dtype=torch.long)
        self.slot_mask[slots] = self.pool.page_mask[torch.tensor(page_ids, dtype=torch.long)]
        self.occupied[slots] = True

    def restore(self, slot_ids: list[int], page_ids: list[int]) -> None:
        device = self.pool.kv_cache.device
        with self._copying(page_ids):
            staged = torch.empty((len(slot_ids), *self.kv_cache.shape[1:]), dtype=self.kv_cache.dtype, device=device)
            for i, slot in enumerate(slot_ids):
                staged[i].copy_(self.kv_cache[slot], non_blocking=True)
            self.pool.kv_cache[:, long_tensor(page_ids, device)] = staged.transpose(0, 1)
        self.pool.page_mask[torch.tensor(page_ids, dtype=torch.long)] = self.slot_mask[torch.tensor(slot_ids)]

    def before_use(self, page_ids) -> None:
        """Make the compute stream wait (on the device; the host goes on) for copies of these pages."""
        if not self._pending:
            return
        stream = torch.cuda.current_stream(self.pool.kv_cache.device)
        for page in set(int(p) for p in page_ids) & self._pending.keys():
            stream.wait_event(self._pending.pop(page))

    @contextlib.contextmanager
    def _copying(self, page_ids: list[int]):
        """One offload or restore: on CUDA, on the side stream after the compute stream's work so far
        (earlier copies are ordered by the side stream itself), then one event for these pages."""
        if not self.on_cuda:
            yield
            return
        self.stream.wait_stream(torch.cuda.current_stream(self.stream.device))
        with torch.cuda.stream(self.stream):
            yield
        done = torch.cuda.Event()
        done.record(self.stream)
        for page in page_ids:
            self._pending[int(page)] = done
