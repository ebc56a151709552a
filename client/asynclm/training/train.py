"""``oven asynclm-train``: LoRA fine-tuning of the served model on ``oven asynclm-data`` samples.

AdamW on the adapter only, linear warm-up then linear decay, batches of samples that share a
prompt prefix (batches.py), in an order fixed by the seed; the weights stay fp32, the matrix
products run in bf16 where the CPU computes bf16 natively (AVX-512 BF16 or AMX; elsewhere bf16 is
emulated, hundreds of times slower than fp32) unless ``precision`` says otherwise. Every
``checkpoint_every`` steps the adapter, the optimizer, the schedule and the loss curve go to
``OUT/checkpoint.pt``; ``resume`` continues from there with the same settings (the checkpoint is
removed once the run completes).
``init`` starts the adapter from an earlier run's folder instead of PEFT's initialisation (a
second stage on new samples, with its own optimizer and schedule); ``training.json`` then keeps
that run's summary under ``init``, so the chain of commands that made the adapter stays on record.
A run stopped by ``max_steps`` writes the adapter it has so far (``training.json``: ``complete``
false, ``steps_done``). The result in ``OUT``: a PEFT adapter folder (``adapter_config.json``, ``adapter_model.safetensors``
in bf16) and ``training.json`` (command, seed, data hashes, settings, loss curve, time); and
``loss.png`` where matplotlib is installed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from oven.proto.peft_folder import CONFIG_FILE, WEIGHTS_FILE

from .batches import Weighing, epoch_order, make_batches
from .data import read_meta, read_records
from .model import LoraSettings, batch_loss, load_base, with_lora

log = logging.getLogger(__name__)
CHECKPOINT = "checkpoint.pt"
ADAPTER_FILES = (CONFIG_FILE, WEIGHTS_FILE, "training.json")
OUT_FILES = ADAPTER_FILES + (CHECKPOINT, "loss.png")  # what a run writes in OUT
PRECISIONS = ("auto", "bf16", "fp32")


def native_bf16() -> bool:
    """Whether this CPU has bf16 matrix instructions (x86 ``avx512_bf16`` or ``amx_bf16``)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


@dataclass(frozen=True)
class TrainConfig:
    data: Path                      # a train.jsonl written by `oven asynclm-data`
    out: Path
    model: str = "smollm2-135m-instruct"
    seed: int = 0
    epochs: int = 1
    lr: float = 1e-3
    warmup_steps: int = 10
    batch_samples: int = 8
    batch_tokens: int = 3584        # tokens forwarded per batch (prefix once, padded suffixes); ~6 GB peak
    lora: LoraSettings = field(default_factory=LoraSettings)
    # Matrix products in bf16 (autocast; ~1.8x faster on AVX-512 BF16) or fp32; auto: bf16 only where
    # the CPU has native bf16 (emulated bf16 ran 0.3 GFLOP/s against fp32's 113 on an AVX2 EPYC).
    precision: str = "auto"
    variants: tuple[str, ...] = ()  # only these variants (all when empty)
    threads: int = os.cpu_count() or 1
    checkpoint_every: int = 25
    max_steps: int | None = None    # stop after this many steps (a checkpoint makes it resumable)
    init: Path | None = None        # an adapter folder to start from (same rank, alpha and targets)
    call_weight: float = 1.0        # the loss weight of the tokens of the calls the model writes
    reject_weight: float = 0.0      # on-policy samples: the weight where the model was corrected (batches.Weighing)

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_samples", "batch_tokens", "threads", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")
        if self.init is not None and self.init.resolve() == self.out.resolve():
            raise ValueError(f"{self.out}: the run would overwrite the adapter it starts from (--init); "
                             "give another --out")
        if self.call_weight <= 0:
            raise ValueError(f"call_weight must be > 0, got {self.call_weight}")
        if self.reject_weight < 0:
            raise ValueError(f"reject_weight must be >= 0, got {self.reject_weight}")
        if self.lr <= 0 or self.warmup_steps < 0:
            raise ValueError("lr must be > 0 and warmup_steps >= 0")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.precision == "auto":  # the resolved one is what settings() and training.json record
            object.__setattr__(self, "precision", "bf16" if native_bf16() else "fp32")

    def settings(self) -> dict:
        """What decides the result (not where it goes or how many threads compute it)."""
        skip = {"data", "out", "threads", "checkpoint_every", "max_steps", "init"}
        return {k: v for k, v in asdict(self).items() if k not in skip}


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _load_records(config: TrainConfig) -> list[dict]:
    if not config.data.exists():
        raise FileNotFoundError(f"{config.data}: no such file (write it with `oven asynclm-data`)")
    records = [r for r in read_records(config.data) if not config.variants or r["variant"] in config.variants]
    if not records:
        raise ValueError(f"{config.data}: no training samples" + (f" of {config.variants}" if config.variants else ""))
    return records


def _learning_rate(config: TrainConfig, step: int, total: int) -> float:
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    remaining = max(1, total - config.warmup_steps)
    return config.lr * max(0.1, 1 - (step - config.warmup_steps) / remaining)


def train(config: TrainConfig, resume: bool = False, command: str | None = None, progress: bool = True) -> dict:
    """Run (or resume) the fine-tuning, up to ``max_steps``; the summary written to ``training.json``."""
    import torch
    from tqdm import tqdm

    checkpoint = config.out / CHECKPOINT
    if resume and not checkpoint.is_file():  # before loading anything
        raise FileNotFoundError(f"{checkpoint}: no checkpoint to resume from")
    torch.set_num_threads(config.threads)
    records = _load_records(config)
    model, source = load_base(config.model, config.seed)
    batches = make_batches(records, config.batch_samples, config.batch_tokens, _weighing(config, source))
    if not batches:
        raise ValueError(f"{config.data}: no sample has tokens to learn (every loss_spans is empty)")
    total = config.epochs * len(batches)
    torch.manual_seed(config.seed)
    model = with_lora(model, config.lora)
    init = _load_init(model, config) if config.init is not None else None
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=0.0)
    data_sha = file_sha256(config.data)
    # A checkpoint is made from the data and the starting adapter: resume checks both.
    made_from = data_sha + (f"+{init['weights_sha256']}" if init else "")
    state = {"step": 0, "losses": [], "elapsed_s": 0.0, "tokens": 0}
    if resume:
        state = _restore(checkpoint, model, optimizer, config, made_from)
    config.out.mkdir(parents=True, exist_ok=True)
    stop = total if config.max_steps is None else min(total, config.max_steps)
    bar = tqdm(total=total, initial=state["step"], desc="asynclm-train", unit="step", disable=not progress,
               dynamic_ncols=True)
    started = time.monotonic() - state["elapsed_s"]
    model.train()
    while state["step"] < stop:
        step = state["step"]
        batch = batches[epoch_order(len(batches), config.seed, step // len(batches))[step % len(batches)]]
        for group in optimizer.param_groups:
            group["lr"] = _learning_rate(config, step, total)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=config.precision == "bf16"):
            loss_sum, loss_weight = batch_loss(model, batch)
        (loss_sum / loss_weight).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        state["losses"].append(round(loss_sum.item() / loss_weight, 5))
        state["tokens"] += batch.num_tokens
        state["step"] = step + 1
        state["elapsed_s"] = time.monotonic() - started
        recent = state["losses"][-10:]
        bar.set_postfix(loss=f"{sum(recent) / len(recent):.4f}", tok_s=f"{state['tokens'] / state['elapsed_s']:.0f}")
        bar.update(1)
        if state["step"] % config.checkpoint_every == 0 or state["step"] == stop < total:
            _save_checkpoint(checkpoint, model, optimizer, config, made_from, state)
    bar.close()
    summary = _finish(model, config, state, total, len(records), data_sha, command, init)
    if summary["complete"]:
        checkpoint.unlink(missing_ok=True)
    return summary


def _weighing(config: TrainConfig, source) -> Weighing:
    if config.call_weight == 1.0:
        return Weighing(reject_weight=config.reject_weight)
    from oven.control.tokenizer import Tokenizer

    from .segments import Encoder, call_markers

    return Weighing(config.call_weight, call_markers(Encoder(Tokenizer(source.tokenizer))), config.reject_weight)


def _load_init(model, config: TrainConfig) -> dict:
    """Copy the LoRA weights of the adapter folder ``config.init`` into ``model``; what training.json
    keeps of it (its name, weights hash and the summary of the run that made it)."""
    from peft.utils import set_peft_model_state_dict
    from safetensors.torch import load_file

    folder = config.init
    weights, adapter_config = folder / "adapter_model.safetensors", folder / "adapter_config.json"
    if not weights.is_file() or not adapter_config.is_file():
        raise FileNotFoundError(f"{folder}: not an adapter folder (no adapter_config.json and "
                                "adapter_model.safetensors)")
    theirs = json.loads(adapter_config.read_text())
    ours = {"r": config.lora.rank, "lora_alpha": config.lora.alpha, "target_modules": sorted(config.lora.targets)}
    got = {"r": theirs.get("r"), "lora_alpha": theirs.get("lora_alpha"),
           "target_modules": sorted(theirs.get("target_modules") or [])}
    if got != ours:
        raise ValueError(f"{folder}: adapter has {got}, this run {ours}; pass the same --rank, --alpha and --targets")
    result = set_peft_model_state_dict(model, {k: v.float() for k, v in load_file(weights).items()})
    if result.unexpected_keys:
        raise ValueError(f"{folder}: weights this model has no place for: {result.unexpected_keys[:3]}")
    summary_path = folder / "training.json"
    return {"name": folder.name, "weights_sha256": file_sha256(weights),
            "training": json.loads(summary_path.read_text()) if summary_path.is_file() else None}


def _trainable_state(model) -> dict:
    return {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}


def _save_checkpoint(path: Path, model, optimizer, config: TrainConfig, data_sha: str, state: dict) -> None:
    import torch

    tmp = path.with_suffix(".tmp")
    torch.save({"adapter": _trainable_state(model), "optimizer": optimizer.state_dict(), "state": state,
                "settings": config.settings(), "data_sha256": data_sha}, tmp)
    os.replace(tmp, path)


def _restore(path: Path, model, optimizer, config: TrainConfig, data_sha: str) -> dict:
    import torch

    saved = torch.load(path, weights_only=False)
    if saved["settings"] != config.settings():
        raise ValueError(f"{path} was made with other settings; run without --resume to start over")
    if saved["data_sha256"] != data_sha:
        raise ValueError(f"{path} was made on other data or from another --init; run without --resume to start over")
    named = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in saved["adapter"].items():
            named[name].copy_(value)
    optimizer.load_state_dict(saved["optimizer"])
    log.info("resuming at step %d", saved["state"]["step"])
    return saved["state"]


def _finish(model, config: TrainConfig, state: dict, total: int, num_samples: int, data_sha: str,
            command: str | None, init: dict | None) -> dict:
    save_adapter(model, config.out, config.model)
    data_meta = read_meta(config.data.parent)
    losses = state["losses"]
    summary = {
        "command": command or " ".join(["oven", *sys.argv[1:]]),
        "seed": config.seed,
        "data_sha256": data_meta.get("sha256"),
        "train_file_sha256": data_sha,
        "data_args": data_meta.get("args"),
        "settings": json.loads(json.dumps(config.settings(), default=str)),
        "samples": num_samples,
        "steps": total,
        "steps_done": state["step"],
        "complete": state["step"] == total,
        "tokens_forwarded": state["tokens"],
        "train_seconds": round(state["elapsed_s"], 1),
        "threads": config.threads,
        "final_loss": round(sum(losses[-10:]) / len(losses[-10:]), 5),
        "loss_curve": losses,
    }
    if init is not None:
        summary["init"] = init
    (config.out / "training.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    _plot(losses, config.out / "loss.png")
    return summary


def save_adapter(model, out: Path, model_spec: str) -> None:
    """The PEFT folder, weights in bf16, naming the base by its oven model spec (not a local path)."""
    import torch
    from safetensors.torch import load_file, save_file

    model.save_pretrained(out, save_embedding_layers=False)  # LoRA only; "auto" looks the base up online
    weights = out / "adapter_model.safetensors"
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in load_file(weights).items()}, weights,
              metadata={"format": "pt"})
    config_path = out / "adapter_config.json"
    adapter_config = json.loads(config_path.read_text())
    adapter_config["base_model_name_or_path"] = model_spec
    config_path.write_text(json.dumps(adapter_config, indent=2, sort_keys=True) + "\n")
    (out / "README.md").unlink(missing_ok=True)  # PEFT's model-card template


def _plot(losses: list[float], path: Path) -> None:
    try:
        import matplotlib
    except ModuleNotFoundError:
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(range(1, len(losses) + 1), losses, linewidth=1)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (weighted mean per loss token)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
