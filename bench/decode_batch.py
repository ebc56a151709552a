"""Batched decode on the CPU: does a batch of 8 decode steps cost little more than one?

Builds an in-process :class:`~oven.inference.engine.Engine` on the CPU (float32
unless ``--dtype``), prefills 16 distinct prompts of ``--context`` tokens (64) on
disjoint pages of 16 tokens, then times one ``forward_text`` decode step (one
token per sequence, ``top_k`` 1 as greedy generation asks) at batch 1, 2, 4, 8
and 16. Every rep rewrites the same KV slot (position ``context``), so each step
attends over ``context + 1`` tokens. Beside each step it times the same batch
through the model's weight matrices alone (``x @ W.T`` for every linear layer
and the LM head): the GEMM floor of this CPU, with no attention, norms or Python.

It also starts a real inference server process (same model, dtype and threads,
private ipc endpoint), prefills it the same way, and times the batch-8 step
through ZeroMQ: transport + serialization = (server step - in-process step) /
server step. All cases run round-robin in one loop, so ratios are side by side.

Goal: batch-8 step <= 1.5x the batch-1 step. Results go to stdout and
``bench/results/decode_batch.md`` (``decode_batch_bfloat16.md`` for ``--dtype bfloat16``).

    .venv/bin/python bench/decode_batch.py              # one torch thread
    .venv/bin/python bench/decode_batch.py --threads 1 2
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import (PagedBatch, check_reply, interleaved_times, iqr, machine_lines, markdown_table,  # noqa: E402
                      medians, text_prompts, write_results)

from oven.control.inference_process import start_inference_process  # noqa: E402
from oven.proto.endpoints import private_endpoint  # noqa: E402
from oven.inference.config import DEFAULT_MODEL, InferenceConfig  # noqa: E402
from oven.inference.engine import Engine  # noqa: E402
from oven.inference.llama import PackedLinear  # noqa: E402
from oven.proto import inference as p  # noqa: E402

log = logging.getLogger("decode_batch")
GOAL_RATIO = 1.5


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL, help="model spec (default: %(default)s)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                        help="weights and KV dtype (default: %(default)s)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1], help="torch thread counts to measure (default: 1)")
    parser.add_argument("--context", type=int, default=64, help="prompt tokens per sequence (default: %(default)s)")
    parser.add_argument("--page-size", type=int, default=16, help="tokens per KV page (default: %(default)s)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16], help="decode batch sizes")
    parser.add_argument("--reps", type=int, default=40, help="timed rounds (default: %(default)s)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed rounds first (default: %(default)s)")
    parser.add_argument("--no-server", action="store_true", help="skip the inference-server comparison")
    args = parser.parse_args()
    if not {1, 8} <= set(args.batch_sizes):
        parser.error("--batch-sizes must include 1 and 8")
    return args


def gemm_case(model: torch.nn.Module, batch_size: int):
    """Every weight matrix a decode step reads, through the same kernels the engine uses
    (oneDNN-packed ``PackedLinear`` or plain ``nn.Linear``; a tied head without one as ``x @ E.T``)."""
    layers = [m for m in model.modules() if isinstance(m, (torch.nn.Linear, PackedLinear))]
    if model.lm_head is None:
        embed = model.model.embed_tokens.weight
        layers.append(lambda x: x @ embed.T)
    shapes = [model.config.hidden_size, model.config.intermediate_size]
    inputs = {n: torch.randn(batch_size, n, dtype=model.dtype) for n in shapes}

    @torch.inference_mode()
    def run() -> None:
        for layer in layers:
            width = layer.weight.shape[1] if hasattr(layer, "weight") else model.config.hidden_size
            layer(inputs[width])
    return run


def top1(reply: p.ForwardTextReply) -> list[int]:
    return [int(np.frombuffer(d[0].token_ids, dtype="<i4")[0]) for d in check_reply(reply).dists]


def codec_seconds(request, reply) -> float:
    """Median seconds to encode and decode one request and its reply (what a round trip serializes)."""
    codec = p.CODEC
    cases = {"codec": lambda: (codec.decode(codec.encode(request, 1)), codec.decode(codec.encode(reply, 1)))}
    return medians(interleaved_times(cases, reps=200, warmup=10))["codec"]


def measure(engine: Engine, batch: PagedBatch, args, threads: int) -> dict:
    """Time every case at one thread count: in process at each batch size, GEMM-only, and through a server."""
    torch.set_num_threads(threads)
    requests = {b: batch.decode_request(b) for b in args.batch_sizes}
    cases = {}
    for b in args.batch_sizes:
        cases[f"engine {b}"] = lambda r=requests[b]: check_reply(engine.forward_text(r))
        cases[f"gemm {b}"] = gemm_case(engine.model, b)
    result: dict = {"threads": threads}
    in_process = engine.forward_text(requests[8])
    result["same_as_batch1"] = top1(engine.forward_text(requests[1]))[0] == top1(in_process)[0]
    if args.no_server:
        result["times"] = interleaved_times(cases, args.reps, args.warmup)
        return result
    cfg = engine.cfg.replace(endpoint=private_endpoint(), torch_threads=threads)
    log.info("starting an inference server (%d threads) at %s", threads, cfg.endpoint)
    with start_inference_process(cfg) as server, server.client() as client:
        for req in batch.prefill_requests(engine.cfg.max_batch_tokens):
            check_reply(client.call(req))
        cases["server 8"] = lambda: check_reply(client.call(requests[8]))
        cases["round trip"] = lambda: client.call(p.HealthRequest())  # transport alone: tiny messages
        log.info("timing %d cases x %d rounds (+%d warmup) at %d threads", len(cases), args.reps, args.warmup, threads)
        result["times"] = interleaved_times(cases, args.reps, args.warmup)
        result["same_as_server"] = top1(client.call(requests[8])) == top1(in_process)
    result["codec"] = codec_seconds(requests[8], in_process)
    return result


def report(r: dict, args) -> str:
    """One thread count's table and ratios, as markdown."""
    m, n = medians(r["times"]), r["threads"]
    t1, g1 = m["engine 1"], m["gemm 1"]
    rows = [[b, f"{m[f'engine {b}'] * 1e3:.1f}", f"{m[f'engine {b}'] / t1:.2f}x", f"{b / m[f'engine {b}']:.0f}",
             f"{b * t1 / m[f'engine {b}']:.2f}x", f"{m[f'gemm {b}'] * 1e3:.1f}", f"{m[f'gemm {b}'] / g1:.2f}x",
             f"{m[f'engine {b}'] / m[f'gemm {b}']:.2f}"] for b in args.batch_sizes]
    ratio = m["engine 8"] / t1
    lines = [f"### {n} torch thread{'s' if n > 1 else ''}", "",
             markdown_table(["batch", "step ms", "step / batch-1", "tokens/s", "per-token speedup",
                             "GEMM-only ms", "GEMM / batch-1", "step / GEMM"], rows), "",
             f"- batch-8 step / batch-1 step: **{ratio:.2f}x** (goal <= {GOAL_RATIO}x: "
             f"{'met' if ratio <= GOAL_RATIO else 'missed'}); per-token speedup {8 / ratio:.2f}x",
             f"- GEMM-only batch-8 / batch-1: {m['gemm 8'] / g1:.2f}x (the weights alone, no engine around them)",
             f"- sequence 0's top-1 token is the same at batch 8 as at batch 1: {r['same_as_batch1']}"]
    if "server 8" in m:
        s, e = m["server 8"], m["engine 8"]
        lines += [f"- batch-8 step through the inference server {s * 1e3:.1f} ms (IQR {iqr(r['times']['server 8']) * 1e3:.1f}) "
                  f"vs {e * 1e3:.1f} ms in process (IQR {iqr(r['times']['engine 8']) * 1e3:.1f}): "
                  f"transport + serialization = **{(s - e) / s:.1%}** of the server step ({(s - e) * 1e3:.2f} ms)",
                  f"- for scale: an empty `health` round trip takes {m['round trip'] * 1e3:.2f} ms; encoding + "
                  f"decoding the batch-8 request and its reply takes {r['codec'] * 1e3:.2f} ms",
                  f"- server and in-process top-1 tokens agree: {r['same_as_server']}"]
    return "\n".join(lines)


def main() -> int:
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    torch.set_num_threads(args.threads[0])
    num_seqs = max(args.batch_sizes)
    # KV pages for exactly these sequences; one host slot (the host tier is unused here).
    cfg = InferenceConfig(model=args.model, device="cpu", dtype=args.dtype, page_size=args.page_size,
                          num_kv_pages=num_seqs * -(-(args.context + 1) // args.page_size), num_host_pages=1,
                          torch_threads=args.threads[0])
    engine = Engine(cfg, progress=False)
    batch = PagedBatch(text_prompts(engine.source.tokenizer.tokenizer_json, num_seqs, args.context), args.page_size)
    log.info("prefilling %d sequences of %d tokens", num_seqs, args.context)
    for req in batch.prefill_requests(cfg.max_batch_tokens):
        check_reply(engine.forward_text(req))
    intro = (f"Model `{engine.model.config.name}` ({args.dtype}, {engine.backend.name} attention), page size "
             f"{args.page_size}, context {args.context + 1} tokens per sequence (each rep rewrites the same slot), "
             f"`top_k` 1, median of {args.reps} interleaved reps after {args.warmup} warmup. "
             "GEMM-only: every weight matrix a decode step reads, through the kernels the engine uses (oneDNN-packed on CPU).")
    print("\n".join(machine_lines()) + "\n" + intro)
    sections = []
    for threads in args.threads:
        sections.append(report(measure(engine, batch, args, threads), args))
        print("\n" + sections[-1])
    name = "decode_batch" if args.dtype == "float32" else f"decode_batch_{args.dtype}"
    print(f"\nwrote {write_results(name, f'Batched decode step on the CPU ({args.dtype})', [intro, *sections])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
