"""The pools and the host tier: duplicate embed ids, offload/restore round trips (CPU, and CUDA when present)."""

from __future__ import annotations

import pytest
import torch

from oven.inference.memory import EmbedPool, HostKvTier, KvPagePool, last_occurrences
from oven.inference.models import resolve_model

DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device")])]


def test_last_occurrences():
    assert last_occurrences([4, 1, 7]) is None
    assert last_occurrences([4, 1, 4, 7, 1, 4]).tolist() == [3, 4, 5]
    assert last_occurrences([]) is None


@pytest.mark.parametrize("device", DEVICES)
def test_a_duplicate_embed_id_keeps_its_last_row(device):
    pool = EmbedPool(8, 4, torch.float32, torch.device(device))
    values = torch.arange(20, dtype=torch.float32, device=device).view(5, 4)
    positions = torch.tensor([10, 11, 12, 13, 14], device=device)
    pool.store([3, 5, 3, 6, 3], values, positions)
    assert torch.equal(pool.embeds[3], values[4]) and pool.positions[3].item() == 14
    assert torch.equal(pool.embeds[5], values[1]) and torch.equal(pool.embeds[6], values[3])
    assert pool.written.nonzero()[0].tolist() == [3, 5, 6]


def filled_pool(device: str) -> KvPagePool:
    cfg = resolve_model("tiny").config
    pool = KvPagePool(cfg, 12, 4, torch.bfloat16 if device == "cuda" else torch.float32, torch.device(device))
    gen = torch.Generator(device=device).manual_seed(0)
    pool.kv_cache.copy_(torch.randn(pool.kv_cache.shape, generator=gen, device=device))
    return pool


@pytest.mark.parametrize("device", DEVICES)
def test_offload_then_restore_elsewhere_is_bit_exact(device):
    pool = filled_pool(device)
    tier = HostKvTier(pool, num_slots=8)
    assert tier.kv_cache.is_pinned() == (device == "cuda")
    pool.page_mask[5, 1] = pool.page_mask[9, 3] = True
    pages, slots = [5, 2, 9], [6, 0, 3]  # neither contiguous nor in order
    before, mask_before = pool.kv_cache[:, pages].clone(), pool.page_mask[pages].clone()
    tier.offload(pages, slots)
    tier.before_use(pages)
    pool.kv_cache[:, pages] = 0  # the pages go to someone else
    pool.page_mask[pages] = False
    targets = [10, 4, 7]
    tier.restore(slots, targets)
    tier.before_use(targets)
    assert torch.equal(pool.kv_cache[:, targets], before)
    assert torch.equal(pool.page_mask[targets], mask_before)
    assert tier.occupied.nonzero()[:, 0].tolist() == [0, 3, 6]
    assert torch.equal(tier.kv_cache[6].to(device), before[:, 0])  # slot-major: a slot is one page, all layers


def test_the_scratch_page_is_beyond_every_valid_id():
    pool = filled_pool("cpu")
    assert pool.scratch_page == pool.num_pages == 12
    assert pool.kv_cache.shape[1] == pool.page_mask.shape[0] == 13
