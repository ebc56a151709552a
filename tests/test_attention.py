"""Attention backends at the kernel level: page tables, masks, and FlashInfer against PyTorch (GPU only)."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from oven.inference.attention import BatchLayout, TorchPagedAttention, make_backend

PAGE = 4


def test_layout_page_table_and_write_slots():
    layout = BatchLayout.build(PAGE, [([7, 2], 3, 2, None), ([5], 1, 1, None), ([1, 0, 3], 4, 9, None)])
    assert layout.qo_indptr.tolist() == [0, 2, 3, 12]
    assert layout.kv_indptr.tolist() == [0, 2, 3, 6]
    assert layout.kv_page_ids.tolist() == [7, 2, 5, 1, 0, 3]
    assert layout.kv_lens.tolist() == [7, 1, 12]
    # item 0: context tokens 5, 6 -> page 2 slots 1, 2; item 1: page 5 slot 0; item 2: tokens 3..11
    assert layout.write_slots.tolist() == [9, 10, 20, 7, 0, 1, 2, 3, 12, 13, 14, 15]


def random_pool(num_pages=16, kv_heads=2, head_dim=8, device="cpu", dtype=torch.float32):
    gen = torch.Generator(device=device).manual_seed(0)
    cache = torch.randn((1, num_pages, 2, PAGE, kv_heads, head_dim), generator=gen, device=device, dtype=dtype)
    return cache, torch.zeros((num_pages, PAGE), dtype=torch.bool)  # page masks live in host memory


def dense_attention(q, k, v, allow):
    """Reference: q [Lq, Hq, D], k/v [Lk, Hkv, D], allow bool [Lq, Lk]."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) / q.shape[-1] ** 0.5
    scores = scores.masked_fill(~allow[None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(scores, -1), v.float())


def test_torch_backend_against_dense_reference_with_masks():
    cache, page_mask = random_pool()
    page_mask[3, 1] = True  # hides context token 1 of item 0
    allow_user = np.ones((3, 10), dtype=bool)
    allow_user[2, :] = False  # a query that may attend to nothing gets zeros
    layout = BatchLayout.build(PAGE, [([3, 4, 5], 2, 3, allow_user), ([8], 1, 1, None)])
    backend = TorchPagedAttention(cache, page_mask, num_q_heads=4)
    backend.plan(layout)
    q = torch.randn(4, 4, 8)
    k, v = torch.randn(4, 2, 8), torch.randn(4, 2, 8)
    out = backend.run(0, q, k, v)
    flat_k = cache[0, :, 0].reshape(-1, 2, 8)
    flat_v = cache[0, :, 1].reshape(-1, 2, 8)
    slots0 = torch.from_numpy(layout.item_slots(0))
    allow0 = torch.ones(3, 10, dtype=torch.bool).tril(7)
    allow0[:, 1] = False
    allow0 &= torch.from_numpy(allow_user)
    ref0 = dense_attention(q[:3], flat_k[slots0], flat_v[slots0], allow0)
    ref0[2] = 0
    torch.testing.assert_close(out[:3], ref0, atol=1e-5, rtol=0)
    ref1 = dense_attention(q[3:], k[3:], v[3:], torch.ones(1, 1, dtype=torch.bool))
    torch.testing.assert_close(out[3:], ref1, atol=1e-5, rtol=0)
    assert torch.equal(flat_k[torch.from_numpy(layout.write_slots)], k)


def test_cpu_never_imports_flashinfer():
    from types import SimpleNamespace

    cache, page_mask = random_pool()
    pool = SimpleNamespace(kv_cache=cache, page_mask=page_mask)
    assert make_backend("auto", pool, 4).name == "torch"
    with pytest.raises(ValueError, match="needs a CUDA device"):
        make_backend("flashinfer", pool, 4)
    assert "flashinfer" not in sys.modules


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("masked", [False, True])
def test_flashinfer_matches_torch_backend(masked):
    pytest.importorskip("flashinfer")
    from oven.inference.attention.flashinfer_paged import FlashInferPagedAttention

    outs = []
    for cls in (TorchPagedAttention, FlashInferPagedAttention):
        cache, page_mask = random_pool(num_pages=64, kv_heads=2, head_dim=64, device="cuda", dtype=torch.bfloat16)
        if masked:
            page_mask[10, 2] = True
        layout = BatchLayout.build(PAGE, [([10, 11, 12], 3, 5, None), ([20], 1, 1, None), ([30, 31], 4, 1, None)])
        backend = cls(cache, page_mask, num_q_heads=8)
        backend.plan(layout)
        gen = torch.Generator(device="cuda").manual_seed(1)
        q = torch.randn(7, 8, 64, generator=gen, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(7, 2, 64, generator=gen, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(7, 2, 64, generator=gen, device="cuda", dtype=torch.bfloat16)
        outs.append(backend.run(0, q, k, v).float())
    torch.testing.assert_close(outs[1], outs[0], atol=2e-2, rtol=2e-2)
