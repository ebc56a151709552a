"""Decode on one CUDA GPU: backend agreement, batch-1 latency vs the bandwidth floor, batching gain, server overhead.

Model ``dummy:llama-3.2-1b`` (random weights, bfloat16), contexts of ``--context``
(512) tokens on pages of 16, one decode token per sequence per step; every rep
rewrites the same KV slot, so each step attends over ``context + 1`` tokens.
Four measurements, each with its goal:

(a) FlashInfer and PyTorch attention agree: two engines with the same seed (same
    weights) run the same prefill batch, then the same decode batch, through
    ``embed_text`` + ``forward``; the output embeds go through ``model.logits``.
    Reports max |p_flashinfer - p_torch| over the full vocabulary (goal <= 2e-2),
    plus max |logit difference| and top-1 agreement (random weights give nearly
    flat distributions, so the logits are the stricter check).
(b) batch-1 decode step (a whole ``forward_text`` call, host work included) vs the
    memory-bandwidth floor = (weight bytes read + KV bytes read) / device copy
    bandwidth, measured with a 1 GiB tensor copy timed by CUDA events (goal <= 1.5x).
    A step reads every matrix once, except an untied embedding table: it only
    gathers the step's rows from it (the LM head is a matrix of its own).
(c) tokens/s at batch 64 vs batch 1 (goal >= 20x).
(d) the batch-32 decode step through a real inference server process vs in
    process: (server - in-process) / server is the share of transport and
    serialization (goal <= 5%).
(e) where a step's time goes (no goal): the device time of the decode graph's
    replay alone (CUDA events), the in-process step less that (planning,
    copies, LM head and top-K, the host's reads of the results), and, from the
    server's own timeline, how long its device thread spent on the batch, so
    that the rest of a round trip is the wire and the threads' hand-offs.

Steps are timed round-robin in one loop with ``torch.cuda.synchronize`` around each
call. Needs CUDA, ``flashinfer-python`` (for (a) and the default backend) and
``pyzmq``. Results go to stdout and ``bench/results/gpu_decode.md``.

    .venv/bin/python bench/gpu_decode.py
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import statistics
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import (PagedBatch, check_reply, interleaved_times, iqr, machine_lines, markdown_table,  # noqa: E402
                      medians, write_results)

from oven.inference.config import InferenceConfig  # noqa: E402
from oven.inference.engine import Engine  # noqa: E402
from oven.proto import inference as p  # noqa: E402

log = logging.getLogger("gpu_decode")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="dummy:llama-3.2-1b", help="model spec (default: %(default)s)")
    parser.add_argument("--backend", default="flashinfer", choices=["flashinfer", "torch"],
                        help="attention backend for (b)-(d) (default: %(default)s)")
    parser.add_argument("--context", type=int, default=512, help="prompt tokens per sequence (default: %(default)s)")
    parser.add_argument("--page-size", type=int, default=16, help="tokens per KV page (default: %(default)s)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 64], help="decode batch sizes")
    parser.add_argument("--server-batch", type=int, default=32, help="batch timed through the server (default: 32)")
    parser.add_argument("--agree-batch", type=int, default=8, help="sequences compared in (a) (default: 8)")
    parser.add_argument("--copy-gib", type=float, default=1.0, help="size of the bandwidth copy (default: 1 GiB)")
    parser.add_argument("--reps", type=int, default=50, help="timed rounds (default: %(default)s)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed rounds first (default: %(default)s)")
    parser.add_argument("--profile", type=Path, metavar="FILE",
                        help="also profile 20 batch-1 steps (torch.profiler) and write its tables to FILE")
    args = parser.parse_args()
    if not {1, 64, args.server_batch} <= set(args.batch_sizes):
        parser.error("--batch-sizes must include 1, 64 and the --server-batch size")
    return args


def require(args) -> None:
    """Fail at once, clearly, on a machine that cannot run this benchmark."""
    if not torch.cuda.is_available():
        sys.exit(f"gpu_decode.py needs a CUDA GPU, and torch {torch.__version__} sees none; "
                 "run bench/decode_batch.py for the CPU figures")
    if importlib.util.find_spec("flashinfer") is None:
        sys.exit("gpu_decode.py needs flashinfer for (a) and its default backend: pip install 'flashinfer-python>=0.7'")
    if importlib.util.find_spec("zmq") is None:
        sys.exit("gpu_decode.py needs pyzmq for the server comparison (d): pip install pyzmq")


def engine_config(args, backend: str, num_pages: int, num_embeds: int = 8192) -> InferenceConfig:
    return InferenceConfig(model=args.model, device="cuda", dtype="bfloat16", attention_backend=backend,
                           page_size=args.page_size, num_kv_pages=num_pages, num_host_pages=1, num_embeds=num_embeds,
                           max_batch_tokens=max(8192, args.agree_batch * args.context))


def random_prompts(num: int, length: int, seed: int) -> list[list[int]]:
    """Distinct random prompts; ids below 32000 are valid in every Llama vocabulary."""
    return np.random.default_rng(seed).integers(0, 32000, size=(num, length)).tolist()


def device_seconds(work, reps: int, warmup: int) -> float:
    """Median device seconds of ``work()``, timed by CUDA events around each of ``reps`` calls after
    ``warmup`` untimed ones."""
    times = []
    for rep in range(warmup + reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        work()
        end.record()
        end.synchronize()
        if rep >= warmup:
            times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def copy_bandwidth(gib: float, reps: int = 10) -> float:
    """Device memory bandwidth in bytes/s: a large copy reads and writes its size once, timed by CUDA events."""
    src = torch.empty(int(gib * 2**30), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * src.numel() / device_seconds(lambda: dst.copy_(src), reps, warmup=3)


@torch.inference_mode()
def final_hidden(engine: Engine, batch: PagedBatch) -> torch.Tensor:
    """Prefill every prompt, then decode one token each, through embed_text + forward; [2B, H] output embeds."""
    num, length = len(batch.prompts), batch.prompt_len
    prefill, decode = batch.prefill_requests(num * length)[0], batch.decode_request(num)
    out_base = num * length + num  # embeds: prefill inputs, decode inputs, then 2B outputs
    for step, req in enumerate((prefill, decode)):
        embed_items, forward_items = [], []
        for i, it in enumerate(req.items):
            first = i * length if step == 0 else num * length + i
            ids = list(range(first, first + len(it.token_ids)))
            embed_items.append(p.EmbedTextItem(it.token_ids, it.positions, ids))
            forward_items.append(p.ForwardItem(it.kv_page_ids, it.kv_last_page_len, ids, [len(ids) - 1],
                                               [out_base + step * num + i]))
        for reply in (engine.embed_text(p.EmbedTextRequest(embed_items)), engine.forward(p.ForwardRequest(forward_items))):
            check_reply(reply)
    return engine.embed_pool.embeds[out_base:out_base + 2 * num]


def agreement(args) -> dict:
    """(a): the same batch through FlashInfer and PyTorch attention; differences of the full distributions."""
    logits = {}
    for backend in ("flashinfer", "torch"):
        batch = PagedBatch(random_prompts(args.agree_batch, args.context, seed=1), args.page_size)
        engine = Engine(engine_config(args, backend, batch.num_pages, (args.context + 3) * args.agree_batch),
                        progress=False)
        with torch.inference_mode():
            logits[backend] = engine.model.logits(final_hidden(engine, batch))
        del engine
        torch.cuda.empty_cache()
    fi, pt = logits["flashinfer"], logits["torch"]
    return {"max_dp": (fi.softmax(-1) - pt.softmax(-1)).abs().max().item(),
            "max_dlogit": (fi - pt).abs().max().item(), "logit_std": pt.std().item(),
            "top1_agree": (fi.argmax(-1) == pt.argmax(-1)).float().mean().item()}


def timings(args) -> dict:
    """(b)-(d): decode steps at every batch size in process, and the server-batch step through a server."""
    from oven.control.inference_process import start_inference_process
    from oven.proto.endpoints import private_endpoint

    batch = PagedBatch(random_prompts(max(args.batch_sizes), args.context, seed=0), args.page_size)
    cfg = engine_config(args, args.backend, batch.num_pages)
    engine = Engine(cfg, progress=False)
    mc = engine.model.config
    log.info("prefilling %d sequences of %d tokens (%s attention)", len(batch.prompts), args.context, engine.backend.name)
    for req in batch.prefill_requests(cfg.max_batch_tokens):
        check_reply(engine.forward_text(req))
    requests = {b: batch.decode_request(b) for b in args.batch_sizes}
    cases = {b: (lambda r=requests[b]: check_reply(engine.forward_text(r))) for b in args.batch_sizes}
    log.info("starting an inference server")
    served = cfg.replace(endpoint=private_endpoint(), timeline_batches=4 * (args.reps + args.warmup))
    with start_inference_process(served, timeout_s=600) as server, server.client() as client:
        for req in batch.prefill_requests(cfg.max_batch_tokens):
            check_reply(client.call(req))
        cases["server"] = lambda: check_reply(client.call(requests[args.server_batch]))
        log.info("timing %d cases x %d rounds (+%d warmup)", len(cases), args.reps, args.warmup)
        client.call(p.TimelineRequest(clear=True))
        times = interleaved_times(cases, args.reps, args.warmup, sync=torch.cuda.synchronize)
        timeline = client.call(p.TimelineRequest(clear=True))
    handled = [(end - start) / 1e9 for n, start, end in zip(timeline.num_items, timeline.starts_ns, timeline.ends_ns)
               if n == args.server_batch][args.warmup:]
    kv_bytes = (args.context + 1) * mc.num_layers * 2 * mc.num_kv_heads * mc.head_dim * engine.dtype.itemsize
    weight_bytes = step_weight_bytes(engine.model)
    graphs = sorted(engine.decode_graphs.graphs) if engine.decode_graphs is not None else []
    if args.profile:
        profile_steps(cases[1], args.profile)
    return {"times": times, "weight_bytes": weight_bytes, "kv_bytes": kv_bytes, "backend": engine.backend.name,
            "graphs": graphs, "replay": replay_times(engine, args), "server_handled": handled}


def profile_steps(step, path: Path, steps: int = 20) -> None:
    """``steps`` calls of ``step`` under torch.profiler (operators by host and by device time), then as many
    under cProfile (the Python functions by their own time: the host work between the kernels)."""
    import cProfile
    import io
    import pstats

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    ops = prof.key_averages()
    python = cProfile.Profile()
    python.enable()
    for _ in range(steps):
        step()
    python.disable()
    functions = io.StringIO()
    pstats.Stats(python, stream=functions).sort_stats("tottime").print_stats(30)
    path.write_text("\n\n".join([
        f"{steps} steps each", ops.table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=70),
        ops.table(sort_by="self_device_time_total", row_limit=20, max_name_column_width=70), functions.getvalue()]))
    log.info("wrote the profile of %d steps to %s", steps, path)


def replay_times(engine: Engine, args) -> dict[int, float]:
    """Median device seconds of one replay of each captured decode graph (the model's forward alone)."""
    graphs = engine.decode_graphs.graphs if engine.decode_graphs is not None else {}
    return {bucket: device_seconds(entry.graph.replay, args.reps, args.warmup)
            for bucket, entry in sorted(graphs.items())}


def step_weight_bytes(model) -> int:
    """Bytes of weights one decode step reads: every parameter, less an untied embedding table."""
    total = sum(t.numel() * t.element_size() for t in model.parameters())
    if model.lm_head is not None and model.lm_head.weight is not model.model.embed_tokens.weight:
        total -= model.model.embed_tokens.weight.numel() * model.model.embed_tokens.weight.element_size()
    return total


def breakdown(t: dict, m: dict, sb: int) -> str:
    """(e): each step's device time against its whole, in process and through the server."""
    parts = []
    for b in sorted(t["replay"]):
        if b in m:
            parts.append(f"batch {b}: graph replay {t['replay'][b] * 1e3:.2f} ms of a {m[b] * 1e3:.2f} ms step")
    if t["server_handled"]:
        handled = statistics.median(t["server_handled"])
        parts.append(f"through the server, batch {sb}: its device thread {handled * 1e3:.2f} ms of a "
                     f"{m['server'] * 1e3:.2f} ms round trip")
    return "- (e) where the time goes: " + ("; ".join(parts) if parts else "no decode graphs (torch attention)")


def main() -> int:
    args = parse_args()
    require(args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    print("\n".join(machine_lines()))
    bandwidth = copy_bandwidth(args.copy_gib)
    agree = agreement(args)
    t = timings(args)
    m, sb = medians(t["times"]), args.server_batch
    floor = (t["weight_bytes"] + t["kv_bytes"]) / bandwidth
    gain = 64 * m[1] / m[64]
    share = (m["server"] - m[sb]) / m["server"]
    rows = [[b, f"{m[b] * 1e3:.2f}", f"{b / m[b]:.0f}", f"{b * m[1] / m[b]:.1f}x"] for b in args.batch_sizes]
    table = markdown_table(["batch", "step ms", "tokens/s", "tokens/s vs batch 1"], rows)
    goal = lambda ok: "met" if ok else "missed"  # noqa: E731
    lines = [
        f"Model `{args.model}` (bfloat16), {t['backend']} attention for (b)-(d) "
        f"(CUDA graphs replayed for decode batches of {t['graphs'] or 'none'}), page size {args.page_size}, "
        f"context {args.context + 1} tokens per sequence (each rep rewrites the same slot), `top_k` 1, "
        f"median of {args.reps} interleaved reps after {args.warmup} warmup.", "", table, "",
        f"- (a) FlashInfer vs PyTorch, batch {args.agree_batch} prefill + decode: max |dp| = {agree['max_dp']:.2e} "
        f"(goal <= 2e-2: {goal(agree['max_dp'] <= 2e-2)}), max |dlogit| = {agree['max_dlogit']:.3f} "
        f"(logit std {agree['logit_std']:.3f}), top-1 agreement {agree['top1_agree']:.0%}",
        f"- (b) batch-1 step {m[1] * 1e3:.2f} ms vs bandwidth floor {floor * 1e3:.2f} ms "
        f"({t['weight_bytes'] / 1e9:.2f} GB weights + {t['kv_bytes'] / 1e6:.1f} MB KV at {bandwidth / 1e9:.0f} GB/s "
        f"copy bandwidth): **{m[1] / floor:.2f}x** (goal <= 1.5x: {goal(m[1] / floor <= 1.5)})",
        f"- (c) tokens/s at batch 64 vs batch 1: **{gain:.1f}x** (goal >= 20x: {goal(gain >= 20)})",
        f"- (d) batch-{sb} step through the server {m['server'] * 1e3:.2f} ms (IQR {iqr(t['times']['server']) * 1e3:.2f}) "
        f"vs {m[sb] * 1e3:.2f} ms in process (IQR {iqr(t['times'][sb]) * 1e3:.2f}): "
        f"transport + serialization = **{share:.1%}** (goal <= 5%: {goal(share <= 0.05)})",
        breakdown(t, m, sb),
    ]
    section = "\n".join(lines)
    print("\n" + section)
    print(f"\nwrote {write_results('gpu_decode', 'Decode on one GPU', [section])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
