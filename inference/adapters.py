"""PEFT LoRA adapters for the served model: reading, validating and keeping the loaded ones.

An adapter is a standard PEFT folder, ``adapter_config.json`` plus
``adapter_model.safetensors``. Nothing in the folder is executed: the config is
JSON, the weights are read with safetensors (a pickled ``adapter_model.bin`` is
refused, never unpickled), and both files are size-checked before reading.

Which (layer, projection) pairs an adapter changes is taken from its tensor
names, the authority PEFT itself writes; the config is checked against them and
against the served model, so an adapter trained for another model, or one using
an option this layer cannot run exactly (DoRA, biases, extra trained modules,
embedding targets, per-module rank patterns), is refused with a one-line
:class:`AdapterError` instead of producing wrong logits.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from oven.proto import inference as p
from oven.proto.peft_folder import WEIGHTS_FILE, AdapterFolderError, read_config

from .config import ModelConfig

PICKLE_FILE = "adapter_model.bin"

# The projections a LoRA adapter may target, in the order a decoder layer runs them, and the groups
# of them that read the same input: one GEMM with their A matrices stacked serves a whole group.
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
INPUT_GROUPS = (("q_proj", "k_proj", "v_proj"), ("o_proj",), ("gate_proj", "up_proj"), ("down_proj",))
QKV, O, GATE_UP, DOWN = range(len(INPUT_GROUPS))
GROUP_OF = {proj: g for g, group in enumerate(INPUT_GROUPS) for proj in group}
EMBEDDING_MODULES = ("embed_tokens", "lm_head")
_BLOCK = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
          "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}
_TENSOR_NAME = re.compile(
    r"base_model\.model\.model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])\.weight")

# Config options whose non-default value changes the math or the model beyond what is run here.
_UNSUPPORTED = {
    "use_dora": ("DoRA (use_dora)", lambda v: bool(v)),
    "bias": ("trained biases (bias={!r})", lambda v: v not in (None, "none")),
    "lora_bias": ("a bias on lora_B (lora_bias)", lambda v: bool(v)),
    "modules_to_save": ("fully trained modules (modules_to_save={!r})", lambda v: bool(v)),
    "trainable_token_indices": ("trained token embeddings (trainable_token_indices)", lambda v: bool(v)),
    "rank_pattern": ("per-module ranks (rank_pattern)", lambda v: bool(v)),
    "alpha_pattern": ("per-module alphas (alpha_pattern)", lambda v: bool(v)),
    "layer_replication": ("layer_replication", lambda v: bool(v)),
    "fan_in_fan_out": ("fan_in_fan_out (transposed Conv1D weights)", lambda v: bool(v)),
    "target_parameters": ("target_parameters", lambda v: bool(v)),
    "use_qalora": ("QA-LoRA (use_qalora)", lambda v: bool(v)),
    "alora_invocation_tokens": ("activated LoRA (alora_invocation_tokens)", lambda v: bool(v)),
    "use_bdlora": ("block-diagonal LoRA (use_bdlora)", lambda v: bool(v)),
    "arrow_config": ("Arrow routing (arrow_config)", lambda v: bool(v)),
    "kasa_config": ("KaSA (kasa_config)", lambda v: bool(v)),
    "monteclora_config": ("MonteCLoRA (monteclora_config)", lambda v: bool(v)),
}


class AdapterError(ValueError):
    """An adapter was refused; the message is one line naming the folder and what is wrong."""


@dataclass(frozen=True, slots=True)
class AdapterLimits:
    max_adapters: int
    max_rank: int
    max_bytes: int


@dataclass(frozen=True, slots=True)
class LoraGroup:
    """An adapter's weights for one input group of one layer (see INPUT_GROUPS), in the model's dtype.

    ``a`` [k * rank, in] stacks the A matrices of the k projections it targets there; ``outputs``
    lists, per projection, its name, its B [out, rank] with the scale folded in (one multiply
    fewer per use), and the rows ``lo:hi`` of ``a`` that are its A.
    """

    a: torch.Tensor
    outputs: tuple[tuple[str, torch.Tensor, int, int], ...]


@dataclass(eq=False)
class LoraAdapter:
    """A loaded adapter: ``groups[(layer, group index)]`` for every input group it targets."""

    adapter_id: int
    name: str
    rank: int
    lora_alpha: float
    scale: float
    groups: dict[tuple[int, int], LoraGroup]
    num_params: int  # of its A and B matrices as trained (a tensor-parallel rank holds slices of them)
    path: str = ""  # the folder it was loaded from, as the control process named it

    def weights(self, layer: int, proj: str) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(A [rank, in], B [out, rank] scaled) of one projection, or None when it is not targeted."""
        group = self.groups.get((layer, GROUP_OF[proj]))
        for name, b, lo, hi in group.outputs if group is not None else ():
            if name == proj:
                return group.a[lo:hi], b
        return None

    def info(self) -> p.AdapterInfo:
        present = {name for g in self.groups.values() for name, _, _, _ in g.outputs}
        return p.AdapterInfo(self.adapter_id, self.name, self.rank, self.lora_alpha, self.scale,
                             [proj for proj in PROJECTIONS if proj in present], self.num_params)


def projection_shapes(cfg: ModelConfig) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of every projection a LoRA adapter may target."""
    q, kv = cfg.num_q_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    h, i = cfg.hidden_size, cfg.intermediate_size
    return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}


def load_adapter(folder: Path, cfg: ModelConfig, limits: AdapterLimits, dtype: torch.dtype,
                 device: torch.device, adapter_id: int, name: str) -> LoraAdapter:
    """Read and check the PEFT folder; raises :class:`AdapterError` (one line) when it does not fit ``cfg``."""
    config = _read_config(folder)
    weights_path = _weights_path(folder, limits.max_bytes)
    rank, alpha, scale = _check_config(folder, config, limits)
    targets = _config_targets(folder, config.get("target_modules"))
    tensors = _read_tensors(folder, weights_path, cfg, targets)
    shapes = projection_shapes(cfg)
    weights = {}
    for (layer, proj), pair in tensors.items():
        where = f"layers.{layer}.{_BLOCK[proj]}.{proj}"
        if set(pair) != {"A", "B"}:
            raise AdapterError(f"{folder}: {where} has lora_{''.join(pair)} without its partner")
        a, b = pair["A"], pair["B"]
        fan_in, fan_out = shapes[proj]
        for what, got, want in (("lora_A", a.shape, (rank, fan_in)), ("lora_B", b.shape, (fan_out, rank))):
            if tuple(got) != want:
                raise AdapterError(
                    f"{folder}: {what} of {where} is {list(got)}, expected {list(want)} for rank {rank} "
                    f"on {cfg.name} (hidden size {cfg.hidden_size}): trained for another model?")
        if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
            raise AdapterError(f"{folder}: {where} holds NaN or infinite weights")
        weights[(layer, proj)] = (a, b)
    _check_coverage(folder, config, cfg, targets, weights)
    num_params = sum(a.numel() + b.numel() for a, b in weights.values())
    return LoraAdapter(adapter_id, name, rank, alpha, scale, _grouped(weights, rank, scale, dtype, device),
                       num_params, str(folder))


def _grouped(weights: dict, rank: int, scale: float, dtype: torch.dtype,
             device: torch.device) -> dict[tuple[int, int], LoraGroup]:
    groups = {}
    for layer in sorted({layer for layer, _ in weights}):
        for g, group in enumerate(INPUT_GROUPS):
            present = [proj for proj in group if (layer, proj) in weights]
            if not present:
                continue
            a = torch.cat([weights[(layer, proj)][0].to(device=device, dtype=dtype) for proj in present])
            outputs = tuple((proj, (weights[(layer, proj)][1].float() * scale).to(device=device, dtype=dtype)
                             .contiguous(), k * rank, (k + 1) * rank) for k, proj in enumerate(present))
            groups[(layer, g)] = LoraGroup(a.contiguous(), outputs)
    return groups


def _read_config(folder: Path) -> dict:
    try:
        return read_config(folder)
    except AdapterFolderError as exc:
        raise AdapterError(str(exc)) from None


def _weights_path(folder: Path, max_bytes: int) -> Path:
    path = folder / WEIGHTS_FILE
    if not path.is_file():
        if (folder / PICKLE_FILE).exists():
            raise AdapterError(f"{folder}: only {PICKLE_FILE} (a pickle, never loaded here); "
                               f"save the adapter as {WEIGHTS_FILE} (save_pretrained(safe_serialization=True))")
        raise AdapterError(f"{folder}: no {WEIGHTS_FILE}")
    size = path.stat().st_size
    if size > max_bytes:
        raise AdapterError(f"{folder}: {WEIGHTS_FILE} is {size / (1 << 20):.1f} MiB, over the "
                           f"{max_bytes / (1 << 20):g} MiB limit (max_adapter_bytes)")
    return path


def _check_config(folder: Path, config: dict, limits: AdapterLimits) -> tuple[int, float, float]:
    """-> (rank, lora_alpha, scale) after refusing what cannot be run exactly."""
    peft_type = config.get("peft_type")
    if peft_type != "LORA":
        raise AdapterError(f"{folder}: peft_type {peft_type!r} is not supported (LoRA only)")
    for option, (what, unsupported) in _UNSUPPORTED.items():
        if unsupported(config.get(option)):
            raise AdapterError(f"{folder}: {what.format(config.get(option))} is not supported")
    rank, alpha = config.get("r"), config.get("lora_alpha")
    if type(rank) is not int or not 1 <= rank <= limits.max_rank:
        raise AdapterError(f"{folder}: rank r={rank!r} is outside [1, {limits.max_rank}] (max_adapter_rank)")
    if type(alpha) not in (int, float) or not math.isfinite(alpha):
        raise AdapterError(f"{folder}: lora_alpha={alpha!r} is not a finite number")
    scale = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    return rank, float(alpha), scale


def _config_targets(folder: Path, target_modules) -> set[str] | re.Pattern:
    """The projection names a list-valued ``target_modules`` names, or the compiled regex of a string one."""
    if isinstance(target_modules, str):
        if target_modules == "all-linear":  # PEFT's shorthand: every linear layer but the output head
            return set(PROJECTIONS)
        try:
            pattern = re.compile(target_modules)
        except re.error as exc:
            raise AdapterError(f"{folder}: target_modules {target_modules!r} is not a valid regex ({exc})") from None
        for embedding in ("model.embed_tokens", "lm_head"):
            if pattern.fullmatch(embedding):
                raise AdapterError(f"{folder}: embedding target {embedding.split('.')[-1]!r} is not supported")
        return pattern
    if not isinstance(target_modules, list) or not target_modules or \
            not all(isinstance(t, str) for t in target_modules):
        raise AdapterError(f"{folder}: target_modules must be a non-empty list of names or a regex")
    names = set()
    for target in target_modules:
        leaf = target.rsplit(".", 1)[-1]  # PEFT matches a name against the end of each module path
        if leaf in EMBEDDING_MODULES:
            raise AdapterError(f"{folder}: embedding target {leaf!r} is not supported")
        if leaf not in PROJECTIONS:
            raise AdapterError(f"{folder}: unknown target module {target!r} (the model has {', '.join(PROJECTIONS)})")
        names.add(leaf)
    return names


def _read_tensors(folder: Path, path: Path, cfg: ModelConfig, targets) -> dict[tuple[int, str], dict]:
    """{(layer, projection): {"A": tensor, "B": tensor}} from the safetensors file, every name checked."""
    from safetensors import SafetensorError, safe_open

    found: dict[tuple[int, str], dict] = {}
    try:
        with safe_open(path, framework="pt") as f:
            for key in f.keys():
                layer, proj, which = _parse_tensor_name(folder, key, cfg, targets)
                tensor = f.get_tensor(key)
                if not tensor.is_floating_point():
                    raise AdapterError(f"{folder}: tensor {key} has dtype {tensor.dtype}, not a float type")
                found.setdefault((layer, proj), {})[which] = tensor
    except SafetensorError as exc:
        raise AdapterError(f"{folder}: {WEIGHTS_FILE} is not a valid safetensors file ({exc})") from None
    if not found:
        raise AdapterError(f"{folder}: {WEIGHTS_FILE} holds no LoRA weights")
    return found


def _parse_tensor_name(folder: Path, key: str, cfg: ModelConfig, targets) -> tuple[int, str, str]:
    match = _TENSOR_NAME.fullmatch(key)
    if match is None:
        if "lora_magnitude_vector" in key:
            raise AdapterError(f"{folder}: DoRA weights ({key}) are not supported")
        if "lora_embedding" in key or any(f".{m}." in key for m in EMBEDDING_MODULES):
            raise AdapterError(f"{folder}: embedding weights ({key}) are not supported")
        raise AdapterError(f"{folder}: unexpected tensor {key!r} (only lora_A/lora_B of decoder projections)")
    layer, block, proj, which = int(match[1]), match[2], match[3], match[4]
    if proj not in PROJECTIONS or _BLOCK[proj] != block:
        raise AdapterError(f"{folder}: unknown target module {block}.{proj} in tensor {key}")
    if layer >= cfg.num_layers:
        raise AdapterError(f"{folder}: tensor {key} is for layer {layer}, "
                           f"but {cfg.name} has {cfg.num_layers} layers: trained for another model?")
    if isinstance(targets, set) and proj not in targets:
        raise AdapterError(f"{folder}: tensor {key} is for {proj}, which target_modules does not name")
    if isinstance(targets, re.Pattern) and not targets.fullmatch(f"model.layers.{layer}.{block}.{proj}") \
            and not targets.fullmatch(proj):
        raise AdapterError(f"{folder}: tensor {key} is for a module that target_modules does not match")
    return layer, proj, which


def _check_coverage(folder: Path, config: dict, cfg: ModelConfig, targets, weights: dict) -> None:
    """A list of targets with no layer or module exclusions means every layer has every target:
    a missing pair is a truncated or foreign file, not an intent."""
    if not isinstance(targets, set) or config.get("layers_to_transform") is not None or config.get("exclude_modules"):
        return
    for layer in range(cfg.num_layers):
        for proj in sorted(targets, key=PROJECTIONS.index):
            if (layer, proj) not in weights:
                raise AdapterError(f"{folder}: no weights for layers.{layer}.{_BLOCK[proj]}.{proj}, which "
                                   f"target_modules names ({cfg.name} has {cfg.num_layers} layers)")


class AdapterRegistry:
    """The adapters loaded now, by id and by name. The control process chooses the ids (0 is the base
    model) and never gives one to another adapter, so a stale id in a late item fails instead of
    reaching another adapter, and an adapter loaded again after a restart keeps its id."""

    def __init__(self, cfg: ModelConfig, limits: AdapterLimits, dtype: torch.dtype, device: torch.device,
                 shard: Callable[[LoraAdapter], LoraAdapter] | None = None):
        """``cfg``: the whole model's shape, which adapters are checked against; ``shard``: what a
        tensor-parallel rank keeps of each (:meth:`oven.inference.sharding.Shard.adapter`)."""
        self.cfg, self.limits, self.dtype, self.device, self.shard = cfg, limits, dtype, device, shard
        self.by_id: dict[int, LoraAdapter] = {}

    def by_name(self, name: str) -> LoraAdapter | None:
        return next((a for a in self.by_id.values() if a.name == name), None)

    def load(self, adapter_id: int, name: str, path: str) -> LoraAdapter:
        if not name or len(name) > 128 or not name.isprintable():
            raise AdapterError(f"adapter name {name[:128]!r} must be 1-128 printable characters")
        if type(adapter_id) is not int or not 1 <= adapter_id < 1 << 31:
            raise AdapterError(f"adapter id {adapter_id!r} must be an integer in [1, 2**31)")
        folder = Path(path).expanduser()
        taken = self.by_name(name)
        if taken is not None and (taken.adapter_id, taken.path) == (adapter_id, str(folder)):
            return taken  # the same load again (a second control loop on this process): already done
        if taken is not None:
            raise AdapterError(f"an adapter named {name!r} is already loaded (id {taken.adapter_id}); unload it first")
        if adapter_id in self.by_id:
            raise AdapterError(f"adapter id {adapter_id} is taken by {self.by_id[adapter_id].name!r}")
        if len(self.by_id) >= self.limits.max_adapters:
            raise AdapterError(f"{len(self.by_id)} adapters are loaded, the most allowed (max_adapters); unload one")
        adapter = load_adapter(folder, self.cfg, self.limits, self.dtype, self.device,
                               adapter_id, name)
        if self.shard is not None:
            adapter = self.shard(adapter)
        self.by_id[adapter.adapter_id] = adapter
        return adapter

    def unload(self, name: str) -> LoraAdapter:
        adapter = self.by_name(name)
        if adapter is None:
            raise AdapterError(f"no adapter named {name!r} is loaded")
        del self.by_id[adapter.adapter_id]
        return adapter
