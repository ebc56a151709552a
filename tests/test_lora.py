"""The LoRA executors agree: FlashInfer's segment-GEMM formulation (stacked, rank-padded adapters, one
launch per factor) against the torch grouping, on CPU through a reference segment GEMM with
SegmentGEMMWrapper.run's semantics, and on CUDA through FlashInfer itself."""

from __future__ import annotations

import pytest
import torch

from oven.inference.adapters import INPUT_GROUPS, AdapterLimits, load_adapter
from oven.inference.lora import GroupedLora, Segment, SegmentGemmLora
from oven.inference.models import resolve_model

from conftest import write_adapter
from test_adapters import ALL


def reference_segment_gemm(x, weights, batch_size, weight_column_major, seg_indptr, weight_indices):
    """SegmentGEMMWrapper.run as documented: segment i of x times weights[weight_indices[i]]."""
    assert weight_column_major and x.is_contiguous()
    out = x.new_zeros((x.shape[0], weights.shape[1]))
    for i in range(batch_size):
        rows = slice(int(seg_indptr[i]), int(seg_indptr[i + 1]))
        out[rows] = x[rows] @ weights[int(weight_indices[i])].T
    return out


def adapters(tmp_path, dtype, device):
    """Three adapters of different ranks and targets for the tiny model."""
    cfg = resolve_model("tiny").config
    limits = AdapterLimits(8, 256, 64 << 20)
    made = []
    for adapter_id, (targets, rank) in enumerate([(ALL, 8), (["q_proj", "v_proj", "down_proj"], 3),
                                                  (["k_proj", "gate_proj"], 16)], start=1):
        folder = tmp_path / f"a{adapter_id}"
        torch.manual_seed(adapter_id)
        write_adapter(folder, cfg, targets=targets, r=rank)
        made.append(load_adapter(folder, cfg, limits, dtype, device, adapter_id, f"a{adapter_id}"))
    return cfg, made


def updates(executor, cfg, segments, x_by_group, num_rows):
    """The LoRA update every projection of every layer gets, starting from zero outputs."""
    executor.plan(segments)
    shapes = {"q_proj": cfg.num_q_heads * cfg.head_dim, "k_proj": cfg.num_kv_heads * cfg.head_dim,
              "v_proj": cfg.num_kv_heads * cfg.head_dim, "o_proj": cfg.hidden_size,
              "gate_proj": cfg.intermediate_size, "up_proj": cfg.intermediate_size, "down_proj": cfg.hidden_size}
    result = {}
    for layer in range(cfg.num_layers):
        for g, group in enumerate(INPUT_GROUPS):
            x = x_by_group[g]
            outs = tuple(x.new_zeros((num_rows, shapes[proj])) for proj in group)
            executor.apply(layer, g, x, outs)
            result.update({(layer, proj): out for proj, out in zip(group, outs)})
    return result


def segments_for(made, runs):
    """runs: (adapter index, number of rows) after 5 base rows -> contiguous Segments."""
    segments, start = [], 5
    for k, n in runs:
        segments.append(Segment(made[k], start, start + n))
        start += n
    return segments, start


def inputs(cfg, num_rows, dtype, device):
    gen = torch.Generator().manual_seed(0)
    widths = [cfg.hidden_size, cfg.num_q_heads * cfg.head_dim, cfg.hidden_size, cfg.intermediate_size]
    return [torch.randn(num_rows, w, generator=gen).to(device=device, dtype=dtype) for w in widths]


def test_segment_gemm_formulation_equals_grouped(tmp_path):
    cfg, made = adapters(tmp_path, torch.float32, torch.device("cpu"))
    segmented = SegmentGemmLora(torch.device("cpu"), reference_segment_gemm)
    segmented.adapters_changed(made)
    segments, num_rows = segments_for(made, [(1, 3), (0, 1), (2, 6), (1, 2)])
    x = inputs(cfg, num_rows, torch.float32, torch.device("cpu"))
    want = updates(GroupedLora(), cfg, segments, x, num_rows)
    got = updates(segmented, cfg, segments, x, num_rows)
    assert set(got) == set(want)
    for key in want:
        torch.testing.assert_close(got[key], want[key], atol=1e-5, rtol=1e-5)
        assert not want[key][:5].any()  # base rows untouched
    # Every adapter's projections moved their rows (the third targets k_proj and gate_proj only).
    assert want[(0, "k_proj")][9:15].abs().min() > 0 and not want[(0, "q_proj")][9:15].any()


def test_unloading_restacks_the_remaining_adapters(tmp_path):
    cfg, made = adapters(tmp_path, torch.float32, torch.device("cpu"))
    segmented = SegmentGemmLora(torch.device("cpu"), reference_segment_gemm)
    segmented.adapters_changed(made)
    segmented.adapters_changed([made[1]])
    assert segmented.slot_by_id == {2: 0}
    assert segmented.stacks[(0, "q_proj")][0].shape == (1, 8, cfg.hidden_size)  # rank 3 padded to 8
    assert (1, "k_proj") not in segmented.stacks
    segments, num_rows = segments_for(made, [(1, 4)])
    x = inputs(cfg, num_rows, torch.float32, torch.device("cpu"))
    want = updates(GroupedLora(), cfg, segments, x, num_rows)
    got = updates(segmented, cfg, segments, x, num_rows)
    for key in want:
        torch.testing.assert_close(got[key], want[key], atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_flashinfer_segment_gemm_equals_grouped(tmp_path):
    pytest.importorskip("flashinfer")
    device = torch.device("cuda")
    cfg, made = adapters(tmp_path, torch.bfloat16, device)
    segmented = SegmentGemmLora(device)
    segmented.adapters_changed(made)
    segments, num_rows = segments_for(made, [(1, 3), (0, 1), (2, 6), (1, 2)])
    x = inputs(cfg, num_rows, torch.bfloat16, device)
    want = updates(GroupedLora(), cfg, segments, x, num_rows)
    got = updates(segmented, cfg, segments, x, num_rows)
    for key in want:
        torch.testing.assert_close(got[key].float(), want[key].float(), atol=0.05, rtol=0.02)
