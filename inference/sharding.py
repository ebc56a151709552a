"""Which slice of every weight one tensor-parallel rank holds (Megatron-style), as pure slicing.

Column-parallel projections (q/k/v, gate/up) keep a slice of their output features, row-parallel
ones (o, down) the matching slice of their input features, so a layer's attention and MLP each
end in a partial sum that one all-reduce completes; embeddings, norms and the LM head are
replicated. Attention is split by kv-head groups (a kv head with its query heads), so grouped
query attention stays inside a rank; the MLP by rows of its intermediate size.

A model whose heads do not divide evenly is still split, as evenly as whole kv groups allow: the
default model, SmolLM2-135M, has 3 kv heads, which two ranks hold as 2 + 1 (the ranks' attention
then costs 2:1, their MLP the same). Only more ranks than kv heads is refused.

LoRA adapters follow their projections: on a column-parallel projection A [rank, in] is replicated
and B [out, rank] keeps the rank's output rows; on a row-parallel one A keeps the rank's input
columns and B is replicated, so the low-rank update is a partial sum like the base output and
the same all-reduce completes it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from .adapters import GATE_UP, INPUT_GROUPS, QKV, LoraAdapter, LoraGroup
from .config import ModelConfig

# The projection's weight dimension a rank slices: 0 (output features) column-parallel, 1 row-parallel.
SPLIT_DIM = {"q_proj": 0, "k_proj": 0, "v_proj": 0, "gate_proj": 0, "up_proj": 0, "o_proj": 1, "down_proj": 1}
_COLUMN_GROUPS = (QKV, GATE_UP)


def _part(total: int, rank: int, world_size: int) -> range:
    """Rank's share of ``total`` units, contiguous; the first ``total % world_size`` ranks get one more."""
    base, extra = divmod(total, world_size)
    start = rank * base + min(rank, extra)
    return range(start, start + base + (rank < extra))


@dataclass(frozen=True, slots=True)
class Shard:
    """One rank's slice of a model of shape ``full``; ``config`` is the shape of what it holds."""

    rank: int
    world_size: int
    full: ModelConfig
    kv_heads: range
    intermediate: range

    @classmethod
    def of(cls, full: ModelConfig, rank: int, world_size: int) -> "Shard":
        """ValueError (one line) when ``full`` cannot give every rank a kv head."""
        check_shardable(full, world_size)
        return cls(rank, world_size, full, _part(full.num_kv_heads, rank, world_size),
                   _part(full.intermediate_size, rank, world_size))

    @property
    def config(self) -> ModelConfig:
        q_per_kv = self.full.num_q_heads // self.full.num_kv_heads
        return dataclasses.replace(self.full, num_kv_heads=len(self.kv_heads),
                                   num_q_heads=len(self.kv_heads) * q_per_kv, intermediate_size=len(self.intermediate))

    def features(self, proj: str) -> slice:
        """The slice of ``proj``'s features this rank holds, along ``SPLIT_DIM[proj]``."""
        units, unit, _ = self._layout(proj)
        return slice(units.start * unit, units.stop * unit)

    def split(self, name: str) -> tuple[int, slice] | None:
        """(dimension, slice) of parameter ``name`` this rank holds; None for a replicated one."""
        proj = _projection(name)
        return None if proj is None else (SPLIT_DIM[proj], self.features(proj))

    def full_shape(self, name: str, shape: torch.Size) -> tuple[int, ...]:
        """The unsharded shape of parameter ``name``, whose shard has ``shape``."""
        full, proj = list(shape), _projection(name)
        if proj is not None:
            _, unit, total = self._layout(proj)
            full[SPLIT_DIM[proj]] = total * unit
        return tuple(full)

    def take(self, name: str, full: torch.Tensor) -> torch.Tensor:
        """This rank's slice of parameter ``name`` from its unsharded value (a view)."""
        split = self.split(name)
        if split is None:
            return full
        dim, part = split
        return full[part] if dim == 0 else full[:, part]

    def adapter(self, adapter: LoraAdapter) -> LoraAdapter:
        """``adapter`` with this rank's slices of its weights (see the module doc); its info unchanged."""
        groups = {}
        for (layer, g), group in adapter.groups.items():
            if g in _COLUMN_GROUPS:
                outputs = tuple((proj, b[self.features(proj)].contiguous(), lo, hi)
                                for proj, b, lo, hi in group.outputs)
                groups[(layer, g)] = LoraGroup(group.a, outputs)
            else:
                (proj,) = INPUT_GROUPS[g]
                groups[(layer, g)] = LoraGroup(group.a[:, self.features(proj)].contiguous(), group.outputs)
        return dataclasses.replace(adapter, groups=groups)

    def _layout(self, proj: str) -> tuple[range, int, int]:
        """(this rank's units, features per unit, units in the model) of ``proj``'s split dimension: kv
        groups for attention, single rows of the intermediate size for the MLP."""
        cfg = self.full
        if proj in ("k_proj", "v_proj"):
            return self.kv_heads, cfg.head_dim, cfg.num_kv_heads
        if proj in ("q_proj", "o_proj"):
            return self.kv_heads, cfg.num_q_heads // cfg.num_kv_heads * cfg.head_dim, cfg.num_kv_heads
        return self.intermediate, 1, cfg.intermediate_size


def _projection(name: str) -> str | None:
    """The split projection whose weight parameter ``name`` is (``model.layers.3.mlp.up_proj.weight``)."""
    module, _, kind = name.rpartition(".")
    proj = module.rpartition(".")[2]
    return proj if kind == "weight" and proj in SPLIT_DIM else None


def check_shardable(cfg: ModelConfig, world_size: int) -> None:
    """ValueError (one line) when ``world_size`` ranks cannot each hold a kv head of ``cfg``."""
    if world_size > cfg.num_kv_heads:
        raise ValueError(f"tensor_parallel {world_size} exceeds the {cfg.num_kv_heads} kv heads of {cfg.name}: "
                         "each rank must hold at least one")

