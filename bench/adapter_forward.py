"""LoRA adapters on the CPU: what does a decode step cost when its items run through adapters?

Builds an in-process :class:`~oven.inference.engine.Engine` on the CPU (SmolLM2-135M,
float32) and loads four PEFT LoRA adapters (random weights, saved by PEFT itself)
of each ``--shapes`` entry: by default rank 16 on all seven projections (the
largest shape issue 14 allows the AsyncLM adapter), rank 8 on the attention
projections (the smallest) and rank 8 on q/k/v/o + up/down (the committed
AsyncLM adapter's shape). It prefills 32 distinct prompts of ``--context``
tokens (64), then times one ``forward_text`` decode step at batch 1, 8 and 32:
every item on the base model, and per shape every item on one adapter and the
items split round-robin over two and over four adapters (one forward each; rows
are grouped per adapter). All cases run round-robin in one loop, so the ratios
to the base step are side by side. Goal: an adapter step <= 1.15x the base step
at batch 8.

Results go to stdout and ``bench/results/adapter_forward.md``.

    .venv/bin/python bench/adapter_forward.py            # one torch thread, about a minute on 2 cores
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import (PagedBatch, check_reply, interleaved_times, iqr, machine_lines, markdown_table,  # noqa: E402
                      medians, text_prompts, write_results)

from oven.inference.adapters import PROJECTIONS  # noqa: E402
from oven.inference.config import DEFAULT_MODEL, InferenceConfig  # noqa: E402
from oven.inference.engine import Engine  # noqa: E402
from oven.proto import inference as p  # noqa: E402

log = logging.getLogger("adapter_forward")
GOAL_RATIO = 1.15
SPLITS = {"1 adapter": 1, "2 adapters": 2, "4 adapters": 4}  # case -> adapters the items use
ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
ASYNCLM = ATTENTION + ["up_proj", "down_proj"]  # the committed AsyncLM adapter's targets
DEFAULT_SHAPES = [(16, list(PROJECTIONS)), (8, ATTENTION), (8, ASYNCLM)]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL, help="model spec (default: %(default)s)")
    parser.add_argument("--shapes", nargs="+", default=DEFAULT_SHAPES, type=parse_shape, metavar="RANK:PROJ,...",
                        help="adapter shapes (default: 16:<all seven projections> 8:q_proj,k_proj,v_proj,o_proj "
                             "8:q_proj,k_proj,v_proj,o_proj,up_proj,down_proj)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: %(default)s)")
    parser.add_argument("--context", type=int, default=64, help="prompt tokens per sequence (default: %(default)s)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32], help="decode batch sizes")
    parser.add_argument("--reps", type=int, default=30, help="timed rounds (default: %(default)s)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed rounds first (default: %(default)s)")
    args = parser.parse_args()
    if 8 not in args.batch_sizes:
        parser.error("--batch-sizes must include 8 (the goal is stated there)")
    return args


def parse_shape(text: str) -> tuple[int, list[str]]:
    rank, _, targets = text.partition(":")
    names = targets.split(",")
    if not rank.isdigit() or not set(names) <= set(PROJECTIONS):
        raise argparse.ArgumentTypeError(f"{text!r}: expected RANK:PROJ,... with projections from {PROJECTIONS}")
    return int(rank), names


def shape_name(shape: tuple[int, list[str]]) -> str:
    rank, targets = shape
    what = {tuple(PROJECTIONS): "all", tuple(ATTENTION): "attn", tuple(ASYNCLM): "attn+up/down"}.get(
        tuple(targets), "+".join(targets))
    return f"r{rank} {what}"


def save_peft_adapters(engine: Engine, folder: Path, count: int, rank: int, targets: list[str]) -> list[Path]:
    """``count`` PEFT LoRA folders for the engine's model, with random non-zero A and B, saved by PEFT."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    base = LlamaForCausalLM(engine.source.hf_config)  # PEFT needs the module tree, not the weights
    model = get_peft_model(base, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=targets))
    paths = []
    for k in range(count):
        gen = torch.Generator().manual_seed(k)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "lora_" in name:
                    param.copy_(torch.randn(param.shape, generator=gen) * 0.01)
        paths.append(folder / f"adapter{k}")
        model.save_pretrained(paths[-1])
    return paths


def with_adapters(request: p.ForwardTextRequest, adapter_ids: list[int]) -> p.ForwardTextRequest:
    """Item i on ``adapter_ids[i % len]`` (round-robin, so one adapter's items are not adjacent)."""
    return p.ForwardTextRequest([dataclasses.replace(item, adapter_id=adapter_ids[i % len(adapter_ids)])
                                 for i, item in enumerate(request.items)])


def report(times: dict[str, list[float]], args) -> str:
    m = medians(times)
    rows, summary = [], []
    for b in args.batch_sizes:
        for key in [f"base {b}"] + [f"{shape_name(s)}, {case} {b}" for s in args.shapes for case in SPLITS]:
            if key in m:
                rows.append([b, key.rsplit(" ", 1)[0], f"{m[key] * 1e3:.1f}", f"{iqr(times[key]) * 1e3:.1f}",
                             f"{m[key] / m[f'base {b}']:.3f}x", f"{b / m[key]:.0f}"])
    for shape in args.shapes:
        ratios = {case: m[f"{shape_name(shape)}, {case} 8"] / m["base 8"] for case in SPLITS}
        summary.append(f"- {shape_name(shape)} at batch 8: " + ", ".join(
            f"{case} **{r:.3f}x**{'' if r <= GOAL_RATIO else ' (over the goal)'}" for case, r in ratios.items())
            + f" the base step (goal <= {GOAL_RATIO}x)")
    table = markdown_table(["batch", "items on", "step ms", "IQR ms", "step / base step", "tokens/s"], rows)
    return table + "\n\n" + "\n".join(summary)


def main() -> int:
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    torch.set_num_threads(args.threads)
    num_seqs, page_size = max(args.batch_sizes), 16
    cfg = InferenceConfig(model=args.model, device="cpu", dtype="float32", page_size=page_size,
                          num_kv_pages=num_seqs * -(-(args.context + 1) // page_size), num_host_pages=1,
                          torch_threads=args.threads, max_adapters=max(SPLITS.values()) * len(args.shapes))
    engine = Engine(cfg, progress=False)
    ids_by_shape = {}
    with tempfile.TemporaryDirectory() as tmp:
        for shape in args.shapes:
            paths = save_peft_adapters(engine, Path(tmp) / shape_name(shape), max(SPLITS.values()), *shape)
            replies = [engine.handle(p.LoadAdapterRequest(len(engine.adapters.by_id) + 1, f"{shape_name(shape)} {k}",
                                                          str(path)))
                       for k, path in enumerate(paths)]
            if not all(isinstance(reply, p.AdapterReply) for reply in replies):
                raise SystemExit(f"loading a benchmark adapter failed: {replies}")
            ids_by_shape[shape_name(shape)] = [reply.adapter.adapter_id for reply in replies]
    batch = PagedBatch(text_prompts(engine.source.tokenizer.tokenizer_json, num_seqs, args.context), page_size)
    log.info("prefilling %d sequences of %d tokens", num_seqs, args.context)
    for req in batch.prefill_requests(cfg.max_batch_tokens):
        check_reply(engine.forward_text(req))
    cases = {}
    for b in args.batch_sizes:
        cases[f"base {b}"] = lambda r=batch.decode_request(b): check_reply(engine.forward_text(r))
        for name, ids in ids_by_shape.items():
            for case, num_adapters in SPLITS.items():
                if num_adapters <= b:
                    request = with_adapters(batch.decode_request(b), ids[:num_adapters])
                    cases[f"{name}, {case} {b}"] = lambda r=request: check_reply(engine.forward_text(r))
    log.info("timing %d cases x %d rounds (+%d warmup)", len(cases), args.reps, args.warmup)
    table = report(interleaved_times(cases, args.reps, args.warmup), args)
    shapes = "; ".join(f"{shape_name(s)} = rank {s[0]} on {', '.join(s[1])}" for s in args.shapes)
    intro = (f"Model `{engine.model.config.name}` (float32, {engine.backend.name} attention, LoRA executor "
             f"`{engine.lora.name}`), {args.threads} torch thread{'s' if args.threads > 1 else ''}, four adapters "
             f"of each shape ({shapes}); decode step (one token per sequence, context {args.context + 1}, `top_k` "
             f"1), median of {args.reps} interleaved reps after {args.warmup} warmup. Split cases give item i "
             "adapter i mod k, all in one forward.")
    print("\n".join(machine_lines()) + "\n" + intro + "\n\n" + table)
    print(f"\nwrote {write_results('adapter_forward', 'LoRA adapter decode step on the CPU', [intro, table])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
