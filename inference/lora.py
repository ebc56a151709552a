"""The grouped LoRA update of a forward batch whose items use different adapters, or none.

The engine orders a batch's items by adapter id, base-model items first, so the
tokens of each adapter form one contiguous run of rows, a :class:`Segment`, and
all adapter rows together form the batch's tail. An executor is planned once per
batch with those segments and applied once per input group per layer (see
``INPUT_GROUPS``): it adds ``(x @ A^T) @ B^T`` (scale folded into B) of each
segment's adapter to the base outputs, in place. A batch without adapter items
plans nothing and the model never calls an executor, so the base path is unchanged.

* :class:`GroupedLora` (torch, any device, any dtype): per segment, one GEMM with
  the group's A matrices stacked, then one in-place ``addmm_`` per projection on
  row views: no gather, no scatter, no copy of the outputs.
* :class:`SegmentGemmLora` (CUDA, fp16/bf16): FlashInfer's
  ``SegmentGEMMWrapper`` covers every segment of a projection in one launch per
  factor, over every loaded adapter's A and B stacked (zero-padded to one rank)
  when the set of loaded adapters changes.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Callable

import torch

from .adapters import INPUT_GROUPS, LoraAdapter
from .transfer import long_tensor

# Where each projection's output sits in the tuple the model passes for its input group.
_SLOT = {proj: slot for group in INPUT_GROUPS for slot, proj in enumerate(group)}
SEGMENT_GEMM_WORKSPACE_BYTES = 128 << 20  # FlashInfer's recommended size for its CUTLASS SM90 path
_SEGMENT_GEMM_ALIGN = 8  # CUTLASS wants 128-bit aligned rows: 8 fp16/bf16 elements


@dataclass(frozen=True, slots=True)
class Segment:
    """Rows ``start:end`` of the batch's token-flattened activations run through ``adapter``."""

    adapter: LoraAdapter
    start: int
    end: int



def merge_runs(segments: list[Segment]) -> list[Segment]:
    """Adjacent segments of one adapter (several items) as one segment: fewer, larger GEMMs."""
    merged = [segments[0]]
    for seg in segments[1:]:
        last = merged[-1]
        if seg.adapter is last.adapter and seg.start == last.end:
            merged[-1] = Segment(last.adapter, last.start, seg.end)
        else:
            merged.append(seg)
    return merged


class LoraExecutor(abc.ABC):
    """Adds the LoRA updates of a planned batch to the base projections' outputs."""

    name: str

    def adapters_changed(self, adapters: list[LoraAdapter]) -> None:
        """Called with every loaded adapter after each load and unload."""

    @abc.abstractmethod
    def plan(self, segments: list[Segment]) -> None:
        """Prepare for a batch; ``segments`` are non-empty, ascending and contiguous (each starts
        where the previous ends)."""

    @abc.abstractmethod
    def apply(self, layer_idx: int, group: int, x: torch.Tensor, outputs: tuple[torch.Tensor, ...]) -> None:
        """x [N, in] is the input of ``INPUT_GROUPS[group]``, ``outputs`` its projections' base
        outputs [N, out] in that order: each gets its adapters' updates added in place."""


class GroupedLora(LoraExecutor):
    name = "torch"

    def __init__(self):
        self.segments: list[Segment] = []

    def plan(self, segments: list[Segment]) -> None:
        self.segments = segments

    def apply(self, layer_idx: int, group: int, x: torch.Tensor, outputs: tuple[torch.Tensor, ...]) -> None:
        for seg in self.segments:
            weights = seg.adapter.groups.get((layer_idx, group))
            if weights is None:
                continue
            low_rank = x[seg.start:seg.end] @ weights.a.T  # [rows, k * rank] for the group's k projections
            for proj, b, lo, hi in weights.outputs:
                outputs[_SLOT[proj]][seg.start:seg.end].addmm_(low_rank[:, lo:hi], b.T)


SegmentGemm = Callable[..., torch.Tensor]  # SegmentGEMMWrapper.run's signature


class SegmentGemmLora(LoraExecutor):
    """Needs activations and adapters in fp16 or bf16 on CUDA, and every projection's in/out
    features a multiple of 8 (see :func:`make_lora_executor`).

    ``segment_gemm`` defaults to a FlashInfer ``SegmentGEMMWrapper``'s ``run``; any
    function with its signature and semantics can stand in for it.
    """

    name = "flashinfer"

    def __init__(self, device: torch.device, segment_gemm: SegmentGemm | None = None):
        if segment_gemm is None:
            from flashinfer.gemm import SegmentGEMMWrapper

            workspace = torch.empty(SEGMENT_GEMM_WORKSPACE_BYTES, dtype=torch.int8, device=device)
            segment_gemm = SegmentGEMMWrapper(workspace).run
        self.device = device
        self._gemm = segment_gemm
        # (layer, projection) -> (A [slots, rank, in], B [slots, out, rank]): "column major" in
        # FlashInfer's terms, i.e. nn.Linear's [out, in] layout, per adapter slot.
        self.stacks: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
        self.slot_by_id: dict[int, int] = {}
        self.rows = slice(0, 0)
        self.num_segments = 0
        self.seg_indptr = self.weight_indices = torch.empty(0, dtype=torch.int64, device=device)

    def adapters_changed(self, adapters: list[LoraAdapter]) -> None:
        self.slot_by_id = {a.adapter_id: slot for slot, a in enumerate(adapters)}
        self.stacks = {}
        if not adapters:
            return
        rank = -(-max(a.rank for a in adapters) // _SEGMENT_GEMM_ALIGN) * _SEGMENT_GEMM_ALIGN
        keys = sorted({(layer, proj) for a in adapters for (layer, _), g in a.groups.items()
                       for proj, _, _, _ in g.outputs})
        for layer, proj in keys:
            pairs = [a.weights(layer, proj) for a in adapters]
            a_ref, b_ref = next(pair for pair in pairs if pair is not None)
            a_stack = a_ref.new_zeros((len(adapters), rank, a_ref.shape[1]))
            b_stack = b_ref.new_zeros((len(adapters), b_ref.shape[0], rank))
            for slot, pair in enumerate(pairs):  # an adapter without this projection keeps zeros: no update
                if pair is not None:
                    a_stack[slot, :pair[0].shape[0]] = pair[0]
                    b_stack[slot, :, :pair[1].shape[1]] = pair[1]
            self.stacks[(layer, proj)] = (a_stack, b_stack)

    def plan(self, segments: list[Segment]) -> None:
        start = segments[0].start
        self.rows = slice(start, segments[-1].end)
        self.num_segments = len(segments)
        bounds = [seg.start - start for seg in segments] + [segments[-1].end - start]
        self.seg_indptr = long_tensor(bounds, self.device)
        self.weight_indices = long_tensor([self.slot_by_id[seg.adapter.adapter_id] for seg in segments], self.device)

    def apply(self, layer_idx: int, group: int, x: torch.Tensor, outputs: tuple[torch.Tensor, ...]) -> None:
        rows = x[self.rows].contiguous()  # the kernel reads rows with a leading dimension of `in`
        for proj, out in zip(INPUT_GROUPS[group], outputs):
            stack = self.stacks.get((layer_idx, proj))
            if stack is None:
                continue
            low_rank = self._run(rows, stack[0])
            out[self.rows] += self._run(low_rank, stack[1])

    def _run(self, x: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        return self._gemm(x, weights, self.num_segments, True, seg_indptr=self.seg_indptr,
                          weight_indices=self.weight_indices)


def make_lora_executor(device: torch.device, dtype: torch.dtype, attention_backend: str,
                       projection_sizes: list[int]) -> LoraExecutor:
    """FlashInfer's segment GEMM where it runs (CUDA with FlashInfer attention, a 16-bit dtype, aligned
    sizes), else the torch grouping. The CPU path never imports FlashInfer."""
    if (device.type == "cuda" and attention_backend == "flashinfer" and dtype in (torch.float16, torch.bfloat16)
            and all(size % _SEGMENT_GEMM_ALIGN == 0 for size in projection_sizes)):
        return SegmentGemmLora(device)
    return GroupedLora()
