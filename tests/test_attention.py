"""Attention backends at the kernel level: page tables, masks, which backend and wrapper a batch gets, and
FlashInfer against PyTorch (GPU only)."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from oven.inference.attention import BatchLayout, TorchPagedAttention, make_backend
from oven.inference.attention.flashinfer_plan import CAUSAL, DECODE, MASKED, append_rows, packed_masks, plan_kind
from oven.inference.attention.toolchain import Toolchain, choose_backend, find_nvcc

PAGE = 4


def test_layout_page_table_and_write_slots():
    layout = BatchLayout.build(PAGE, [([7, 2], 3, 2, None), ([5], 1, 1, None), ([1, 0, 3], 4, 9, None)])
    assert layout.qo_indptr.tolist() == [0, 2, 3, 12]
    assert layout.kv_indptr.tolist() == [0, 2, 3, 6]
    assert layout.kv_page_ids.tolist() == [7, 2, 5, 1, 0, 3]
    assert layout.kv_lens.tolist() == [7, 1, 12]
    # item 0: context tokens 5, 6 -> page 2 slots 1, 2; item 1: page 5 slot 0; item 2: tokens 3..11
    assert layout.write_slots.tolist() == [9, 10, 20, 7, 0, 1, 2, 3, 12, 13, 14, 15]


def test_vectorised_slots_and_mask_check_equal_their_per_item_definitions():
    """On random layouts (decode and prefill, shared pages, partial last pages): every item's context slots
    are its pages' slots cut to its length, its write slots the last q_len of them, and a custom mask is
    needed exactly when a slot in some context is hidden (a hidden bit past a last page's end does not count)."""
    rng = np.random.default_rng(0)
    for trial in range(500):
        page = int(rng.integers(1, 9))
        items = []
        for _ in range(int(rng.integers(1, 6))):
            num_pages, last = int(rng.integers(1, 5)), int(rng.integers(1, page + 1))
            kv_len = (num_pages - 1) * page + last
            q_len = 1 if trial % 2 else int(rng.integers(1, kv_len + 1))
            items.append((rng.integers(0, 20, num_pages).tolist(), last, q_len, None))
        layout = BatchLayout.build(page, items)
        contexts = [(np.array(pages)[:, None] * page + np.arange(page)).reshape(-1)[:(len(pages) - 1) * page + last]
                    for pages, last, _, _ in items]
        for b, context in enumerate(contexts):
            assert layout.item_slots(b).tolist() == context.tolist()
        assert layout.write_slots.tolist() == [s for (_, _, q, _), c in zip(items, contexts) for s in c[len(c) - q:]]
        page_mask = torch.from_numpy(rng.random((20, page)) < 0.03)
        backend = TorchPagedAttention(torch.zeros((1, 20, 2, page, 1, 8)), page_mask, num_q_heads=1)
        assert backend.needs_custom_mask(layout) == bool(page_mask.view(-1)[np.concatenate(contexts)].any())


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


READY = Toolchain("0.7.2.post1", "/usr/local/cuda/bin/nvcc", "ninja", None)
CUDA = torch.device("cuda")


def test_backend_choice_by_device_dtype_and_head_size():
    assert choose_backend("auto", CUDA, torch.bfloat16, 128, READY) == ("flashinfer", None)
    assert choose_backend("auto", CUDA, torch.float16, 64, READY) == ("flashinfer", None)
    assert choose_backend("torch", CUDA, torch.bfloat16, 128, READY) == ("torch", None)
    assert choose_backend("auto", torch.device("cpu"), torch.float32, 64, READY) == \
        ("torch", "the flashinfer backend needs a CUDA device")
    # --dtype float32 on CUDA: no fp32 kernels, so auto falls back and an explicit request is refused.
    assert choose_backend("auto", CUDA, torch.float32, 64, READY) == \
        ("torch", "FlashInfer has no float32 attention kernels (float16 and bfloat16 only)")
    with pytest.raises(ValueError, match="FlashInfer has no float32 attention kernels"):
        choose_backend("flashinfer", CUDA, torch.float32, 64, READY)
    # The tiny test model's head size 16 has no FlashInfer kernel.
    assert choose_backend("auto", CUDA, torch.bfloat16, 16, READY) == \
        ("torch", "FlashInfer's attention kernels take head sizes 64, 128, 256, not 16")


def test_backend_choice_needs_a_compiler_or_matching_prebuilt_kernels():
    bare = Toolchain("0.7.2.post1", None, "ninja", None)
    assert choose_backend("auto", CUDA, torch.bfloat16, 64, bare) == (
        "torch", "FlashInfer 0.7.2.post1 compiles its kernels at first use, but nvcc (a CUDA toolkit) is missing "
                 "and no flashinfer-jit-cache==0.7.2.post1")
    prebuilt = Toolchain("0.7.2.post1", None, None, "0.7.2.post1+cu130")
    assert choose_backend("auto", CUDA, torch.bfloat16, 64, prebuilt) == ("flashinfer", None)
    stale = Toolchain("0.7.2.post1", None, None, "0.7.1+cu130")
    with pytest.raises(ValueError, match=r"nvcc \(a CUDA toolkit\) and ninja is missing and flashinfer-jit-cache "
                                         r"0\.7\.1\+cu130 does not match flashinfer 0\.7\.2\.post1"):
        choose_backend("flashinfer", CUDA, torch.bfloat16, 64, stale)
    assert choose_backend("auto", CUDA, torch.bfloat16, 64, Toolchain(None, "nvcc", "ninja", None)) == \
        ("torch", "flashinfer-python is not installed (pip install 'oven[gpu]')")


def test_nvcc_is_looked_for_where_flashinfer_looks(tmp_path, monkeypatch):
    nvcc = tmp_path / "cuda" / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text("#!/bin/sh\n")
    monkeypatch.delenv("FLASHINFER_NVCC", raising=False)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    assert find_nvcc() is None  # not executable
    nvcc.chmod(0o755)
    assert find_nvcc() == str(nvcc)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "nowhere"))  # FlashInfer takes CUDA_HOME as given
    assert find_nvcc() is None
    monkeypatch.setenv("FLASHINFER_NVCC", str(nvcc))
    assert find_nvcc() == str(nvcc)


def test_each_batch_gets_the_wrapper_that_can_run_it():
    """Causal prefill, then masked prefill, decode, masked decode on one backend: a masked batch never
    reaches the causal wrapper (fa3 on Hopper rejects custom masks), whatever ran before."""
    cache, page_mask = random_pool()
    backend = TorchPagedAttention(cache, page_mask, num_q_heads=4)  # the mask logic is the base class's
    allow = np.ones((2, 6), dtype=bool)
    allow[:, 1] = False
    steps = [
        ([([1, 2], 3, 7, None), ([3], 2, 2, None)], CAUSAL),
        ([([1, 2], 4, 1, None), ([4, 5], 2, 2, allow)], MASKED),
        ([([1, 2], 4, 1, None), ([3], 3, 1, None)], DECODE),
    ]
    for items, kind in steps:
        layout = BatchLayout.build(PAGE, items)
        backend.clear_written_mask_bits(layout)
        assert plan_kind(layout, backend.needs_custom_mask(layout)) == kind
    page_mask[1, 2] = True  # Context.drop of one token of item 0
    layout = BatchLayout.build(PAGE, [([1, 2], 4, 1, None), ([3], 3, 1, None)])
    backend.clear_written_mask_bits(layout)
    assert plan_kind(layout, backend.needs_custom_mask(layout)) == MASKED


def test_append_rows_match_flashinfers_documented_example():
    """flashinfer.get_batch_indices_positions' docstring: append_indptr [0, 1, 3, 6, 10], seq_lens 5 each."""
    layout = BatchLayout.build(PAGE, [([0, 1], 1, n, None) for n in (1, 2, 3, 4)])
    batch_indices, positions = append_rows(layout)
    assert batch_indices.tolist() == [0, 1, 1, 2, 2, 2, 3, 3, 3, 3]
    assert positions.tolist() == [4, 3, 4, 2, 3, 4, 1, 2, 3, 4]
    assert batch_indices.dtype == positions.dtype == np.int32


def test_packed_masks_read_back_as_the_kernel_addresses_them():
    """The kernel reads item b's bit (q, k) at byte mask_indptr[b] + (q * kv_len + k) // 8, bit (q * kv_len + k)
    % 8, and FlashInfer 0.7's plan() makes mask_indptr the cumulative q_len * kv_len of the items before b."""
    rng = np.random.default_rng(0)
    shapes = [(3, 10), (1, 5), (7, 7), (2, 13)]
    masks = [rng.random(shape) < 0.5 for shape in shapes]
    packed = packed_masks(masks)
    assert packed.dtype == np.uint8
    mask_indptr = np.concatenate([[0], np.cumsum([q * kv for q, kv in shapes])])
    for b, mask in enumerate(masks):
        q_len, kv_len = mask.shape
        offsets = np.arange(q_len * kv_len)
        bits = (packed[mask_indptr[b] + offsets // 8] >> (offsets % 8)) & 1
        assert np.array_equal(bits.astype(bool), mask.reshape(-1))
    assert len(packed) == mask_indptr[-2] + (shapes[-1][0] * shapes[-1][1] + 7) // 8


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_flashinfer_matches_torch_backend_across_call_patterns():
    """One FlashInfer backend plans causal prefill, masked prefill, decode, then masked decode (the order that
    broke on Hopper: fa3 chosen by the first plan, then handed a mask); each step's attention equals the
    PyTorch backend's on an identical cache, and each went through the wrapper meant for it."""
    pytest.importorskip("flashinfer")
    from oven.inference.attention.flashinfer_paged import FlashInferPagedAttention

    allow = np.ones((3, 12), dtype=bool)
    allow[:, [2, 5]] = False
    steps = [  # (items, page-mask bits to set first, kind)
        ([([10, 11, 12], 3, 5, None), ([20], 4, 4, None), ([30, 31], 4, 7, None)], [], CAUSAL),
        ([([10, 11, 12], 4, 1, None), ([21, 22], 4, 3, None), ([30, 31, 32], 4, 8, None)], [(10, 2)], MASKED),
        ([([40, 41, 42], 4, 3, allow)], [], MASKED),
        # page 10's hidden slot stays hidden: a decode batch has no item reading it
        ([([40, 41, 42], 4, 1, None), ([20], 4, 1, None), ([30, 31, 32], 1, 1, None)], [], DECODE),
        ([([10, 11, 12], 4, 1, None), ([30, 31, 32], 2, 1, None)], [(31, 0), (31, 3)], MASKED),
    ]
    cache, page_mask = random_pool(num_pages=64, kv_heads=2, head_dim=64, device="cuda", dtype=torch.bfloat16)
    torch_cache, torch_mask = cache.clone(), page_mask.clone()
    fi = FlashInferPagedAttention(cache, page_mask, num_q_heads=8)
    ref = TorchPagedAttention(torch_cache, torch_mask, num_q_heads=8)
    gen = torch.Generator(device="cuda").manual_seed(1)
    for items, hidden, kind in steps:
        for page, slot in hidden:
            page_mask[page, slot] = torch_mask[page, slot] = True
        layout = BatchLayout.build(PAGE, items)
        n = int(layout.qo_indptr[-1])
        q = torch.randn(n, 8, 64, generator=gen, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(n, 2, 64, generator=gen, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(n, 2, 64, generator=gen, device="cuda", dtype=torch.bfloat16)
        outs = []
        for backend in (fi, ref):
            backend.plan(layout)
            outs.append(backend.run(0, q, k, v).float())
        assert fi.planned_kind == kind
        torch.testing.assert_close(outs[0], outs[1], atol=2e-2, rtol=2e-2)
        assert torch.equal(cache, torch_cache)  # both appended the same K/V to the same slots
