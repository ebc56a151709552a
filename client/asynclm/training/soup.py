"""A weighted average of LoRA adapters of one base model (a "model soup"), truncated back to one rank.

Adapters fine-tuned from the same starting adapter on different data sit close together in weight
space, and their average can score above each of them: at the edge of what the model can do, each
one gets a different handful of tasks right by chance, and averaging keeps what they share. PEFT
does the arithmetic
(``add_weighted_adapter``, combination "svd"): the weighted sum of the parts' weight deltas
(B·A·scale), factored again by SVD at ``rank``, so the soup is a plain PEFT adapter of the parts'
size that the engine serves like any other. ``training.json`` keeps each part's own record.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

SOUP_NAME = "default"  # PEFT saves an adapter with another name into a subfolder


@dataclass(frozen=True)
class SoupConfig:
    parts: tuple[Path, ...]
    out: Path
    model: str
    weights: tuple[float, ...] = ()  # empty: every part the same weight
    rank: int | None = None  # None: the largest rank among the parts

    def __post_init__(self) -> None:
        if len(self.parts) < 2:
            raise ValueError("a soup needs at least two adapters")
        if self.weights and len(self.weights) != len(self.parts):
            raise ValueError(f"{len(self.weights)} weights for {len(self.parts)} adapters")
        if self.rank is not None and self.rank < 1:
            raise ValueError(f"rank must be >= 1, got {self.rank}")
        if self.weights and (not all(map(math.isfinite, self.weights)) or sum(self.weights) == 0):
            raise ValueError(f"weights {', '.join(f'{w:g}' for w in self.weights)}: an average needs finite "
                             "weights with a sum other than 0")
        for part in self.parts:
            if not (part / "adapter_config.json").is_file() or not (part / "adapter_model.safetensors").is_file():
                raise FileNotFoundError(f"{part}: not a PEFT adapter folder (adapter_config.json and "
                                        "adapter_model.safetensors)")
        if self.out.resolve() in {p.resolve() for p in self.parts}:
            raise ValueError(f"{self.out}: the soup would overwrite one of its parts")

    def part_weights(self) -> tuple[float, ...]:
        return self.weights or tuple(1 / len(self.parts) for _ in self.parts)


def make_soup(config: SoupConfig, command: str | None = None) -> dict:
    """Write ``config.out`` (the PEFT folder, bf16, and training.json); the record written."""
    from oven.proto.peft_folder import read_config

    from .model import load_base, with_adapters
    from .train import file_sha256, save_adapter

    configs = [read_config(p) for p in config.parts]  # its error names the folder
    for part, part_config in zip(config.parts, configs):
        if part_config.get("peft_type") != "LORA":
            raise ValueError(f"{part}: a {part_config.get('peft_type')} adapter, not LoRA")
        if part_config.get("base_model_name_or_path") != config.model:
            raise ValueError(f"{part}: an adapter of {part_config.get('base_model_name_or_path')!r}, not of "
                             f"{config.model!r} (--model)")
    shapes = [_lora_shapes(part) for part in config.parts]
    if config.rank is not None:
        _check_rank(config.rank, shapes)
    model, _ = load_base(config.model, seed=0)
    for part, part_shapes in zip(config.parts, shapes):  # PEFT's own error is a traceback of tensor sizes
        _check_fits(model, part, part_shapes, config.model)
    peft_model, names = with_adapters(model, config.parts)
    rank = config.rank or max(c["r"] for c in configs)
    peft_model.add_weighted_adapter(names, list(config.part_weights()), SOUP_NAME, combination_type="svd",
                                    svd_rank=rank)
    peft_model.set_adapter(SOUP_NAME)
    for name in names:
        peft_model.delete_adapter(name)
    config.out.mkdir(parents=True, exist_ok=True)
    save_adapter(peft_model, config.out, config.model)
    alphas = {c["lora_alpha"] for c in configs}
    if len(alphas) == 1:
        _with_alpha(config.out, alphas.pop(), rank)
    record = {
        "command": command,
        "combination": "PEFT add_weighted_adapter, svd",
        "rank": rank,
        "parts": [{"name": part.name, "weight": weight,
                   "weights_sha256": file_sha256(part / "adapter_model.safetensors"), "training": _training(part)}
                  for part, weight in zip(config.parts, config.part_weights())],
    }
    (config.out / "training.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return record


def _lora_shapes(part: Path) -> dict[str, tuple[int, int, int]]:
    """Per module the LoRA of ``part`` adapts (its name in the base model): (rank, in features, out
    features), from the weights file's header alone."""
    from safetensors import SafetensorError, safe_open

    from oven.proto.peft_folder import WEIGHTS_FILE

    a_shapes, b_shapes = {}, {}
    try:
        with safe_open(part / WEIGHTS_FILE, "pt") as f:
            for key in f.keys():
                module, _, kind = key.removeprefix("base_model.model.").rpartition(".lora_")
                if kind in ("A.weight", "B.weight"):
                    (a_shapes if kind == "A.weight" else b_shapes)[module] = f.get_slice(key).get_shape()
    except (OSError, SafetensorError) as exc:
        raise ValueError(f"{part}: {WEIGHTS_FILE} is unreadable ({exc})") from None
    shapes = {m: (a[0], a[1], b_shapes[m][0]) for m, a in a_shapes.items() if m in b_shapes}
    if not shapes:
        raise ValueError(f"{part}: {WEIGHTS_FILE} holds no LoRA weights")
    return shapes


def _check_rank(rank: int, shapes: list[dict[str, tuple[int, int, int]]]) -> None:
    """The weighted sum of the deltas has rank at most the parts' ranks summed, and at most the smaller
    side of each matrix: a soup of higher rank holds only zeros beyond that, and at a rank in the
    thousands PEFT's matrices alone fill the memory."""
    summed = sum(max(r for r, _, _ in part.values()) for part in shapes)
    smallest = min(min(n_in, n_out) for part in shapes for _, n_in, n_out in part.values())
    if rank > min(summed, smallest):
        raise ValueError(f"rank {rank}: at most {min(summed, smallest)} here (the parts' ranks sum to {summed}, the "
                         f"smallest target matrix has {smallest} rows or columns); more adds nothing")


def _check_fits(model, part: Path, shapes: dict[str, tuple[int, int, int]], model_spec: str) -> None:
    for module, (_, n_in, n_out) in shapes.items():
        try:
            target = model.get_submodule(module)
        except AttributeError:
            raise ValueError(f"{part}: adapts {module}, which --model {model_spec} does not have") from None
        want = (getattr(target, "in_features", None), getattr(target, "out_features", None))
        if (n_in, n_out) != want:
            raise ValueError(f"{part}: its LoRA of {module} is {n_in}x{n_out} (in x out), that of --model "
                             f"{model_spec} {want[0]}x{want[1]}: an adapter of another model")


def _with_alpha(folder: Path, alpha: float, rank: int) -> None:
    """PEFT writes the soup with lora_alpha = rank (scale 1); give it the parts' alpha instead, B divided
    by the new scale (a power of two in the usual case, so exact in bf16), so that a next stage
    (``oven asynclm-train --init``) takes the parts' ``--alpha`` and learns at their scale."""
    from safetensors.torch import load_file, save_file

    weights = folder / "adapter_model.safetensors"
    scale = alpha / rank
    save_file({k: (v.float() / scale).to(v.dtype) if ".lora_B." in k else v for k, v in load_file(weights).items()},
              weights, metadata={"format": "pt"})
    config_path = folder / "adapter_config.json"
    adapter_config = json.loads(config_path.read_text())
    adapter_config["lora_alpha"] = alpha
    config_path.write_text(json.dumps(adapter_config, indent=2, sort_keys=True) + "\n")


def _training(part: Path) -> dict | None:
    path = part / "training.json"
    return json.loads(path.read_text()) if path.is_file() else None
