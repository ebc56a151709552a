"""Tensor parallelism: what does a decode step cost on two ranks against one process?

(a) Starts two real inference servers on SmolLM2-135M (float32, one torch thread per rank on the
CPU, private ipc endpoints): one process, and a tensor-parallel group of ``--tensor-parallel`` ranks
(2), over gloo on the CPU, NCCL on CUDA. Both prefill 16 distinct prompts of ``--context`` tokens
(64) on disjoint pages of 16, then decode steps of one token per sequence (``top_k`` 1) at batch 1
and 16 are timed through ZeroMQ, round-robin over the four cases so drift hits all alike; every rep
rewrites the same KV slot. The two servers' top-1 tokens are compared.

(b) What the group itself costs a step, timed alone in two processes: the all-reduces a step runs
(two per layer, [batch, hidden] in the model's dtype, gloo or NCCL) and the broadcast of a decode
request to the other rank (gloo), so (a)'s ratio can be read as compute split in two plus this.

No goal on a 2-core CPU: the ranks share the cores that one process had alone (and the machine's
other work), and gloo over loopback costs each all-reduce a round of wake-ups. Results go to stdout
and ``bench/results/tensor_parallel.md`` (``tensor_parallel_cuda.md`` with ``--device cuda``, where
``bench/gpu_check.sh`` runs it on ``dummy:llama-3.2-1b`` in bfloat16 when it sees two GPUs).

    .venv/bin/python bench/tensor_parallel.py
    python bench/tensor_parallel.py --device cuda --dtype bfloat16 --model dummy:llama-3.2-1b
"""

from __future__ import annotations

import logging
import os
import socket
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import (PagedBatch, check_reply, doc_parser, interleaved_times, iqr, markdown_table,  # noqa: E402
                      medians, text_prompts, write_results)

from oven.control.inference_process import start_inference_process  # noqa: E402
from oven.inference.config import DEFAULT_MODEL, InferenceConfig  # noqa: E402
from oven.inference.tensor_parallel import BACKENDS  # noqa: E402
from oven.proto import inference as p  # noqa: E402
from oven.proto.endpoints import private_endpoint  # noqa: E402

log = logging.getLogger("tensor_parallel")
BATCH_SIZES = (1, 16)


def parse_args():
    parser = doc_parser(__doc__)
    parser.add_argument("--model", default=DEFAULT_MODEL, help="model spec (default: %(default)s)")
    parser.add_argument("--tensor-parallel", type=int, default=2, help="ranks of the group (default: %(default)s)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="(default: %(default)s)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="(default: %(default)s)")
    parser.add_argument("--context", type=int, default=64, help="prompt tokens per sequence (default: %(default)s)")
    parser.add_argument("--reps", type=int, default=30, help="timed rounds (default: %(default)s)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed rounds first (default: %(default)s)")
    return parser.parse_args()


def top1(reply: p.ForwardTextReply) -> list[int]:
    return [int(np.frombuffer(d[0].token_ids, "<i4")[0]) for d in reply.dists]


def served_steps(args) -> tuple[dict[str, list[float]], float, p.InfoReply]:
    """(a): step times of every case, the share of top-1 tokens the two servers agree on, the model's info."""
    configs = {n: InferenceConfig(model=args.model, device=args.device, dtype=args.dtype, endpoint=private_endpoint(),
                                  torch_threads=1, num_kv_pages=256, tensor_parallel=n)
               for n in (1, args.tensor_parallel)}
    servers = {n: start_inference_process(cfg, timeout_s=300) for n, cfg in configs.items()}
    try:
        clients = {n: server.client() for n, server in servers.items()}
        info = clients[1].info()
        batch = PagedBatch(text_prompts(info.tokenizer.tokenizer_json, max(BATCH_SIZES), args.context), info.page_size)
        for client in clients.values():
            for request in batch.prefill_requests(info.max_batch_tokens):
                check_reply(client.call(request))
        requests = {b: batch.decode_request(b) for b in BATCH_SIZES}
        cases = {f"{n} rank{'s' if n > 1 else ''}, batch {b}": (lambda c=clients[n], r=requests[b]:
                                                              check_reply(c.call(r)))
                 for b in BATCH_SIZES for n in clients}
        log.info("timing %d cases, %d reps", len(cases), args.reps)
        times = interleaved_times(cases, args.reps, args.warmup)
        pairs = [pair for b in BATCH_SIZES for pair in zip(top1(clients[1].call(requests[b])),
                                                           top1(clients[args.tensor_parallel].call(requests[b])))]
        for client in clients.values():
            client.close()
        return times, sum(a == b for a, b in pairs) / len(pairs), info
    finally:
        for server in servers.values():
            server.stop()


def _group_costs(rank: int, port: int, info: p.InfoReply, reps: int, out) -> None:
    """(b), in each of two processes: seconds per step of the all-reduces and of the request broadcast."""
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=2)
    device = torch.device("cuda", rank) if info.device.startswith("cuda") else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    compute = dist.new_group(backend=BACKENDS[device.type])
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    batch = PagedBatch([[1] * 64] * max(BATCH_SIZES), 16)
    result = {}
    for b in BATCH_SIZES:
        x = torch.ones(b, info.hidden_size, dtype=getattr(torch, info.dtype), device=device)
        request = [(b"peer", batch.decode_request(b))]
        samples_reduce, samples_send = [], []
        for _ in range(reps):
            dist.barrier()
            start = time.perf_counter()
            for _ in range(2 * info.num_layers):
                dist.all_reduce(x, group=compute)
            sync()
            samples_reduce.append(time.perf_counter() - start)
            dist.barrier()
            start = time.perf_counter()
            dist.broadcast_object_list(request, src=0)
            samples_send.append(time.perf_counter() - start)
        result[b] = (statistics.median(samples_reduce), statistics.median(samples_send))
    if rank == 0:
        out.put(result)
    dist.destroy_process_group()


def group_costs(info: p.InfoReply, reps: int) -> dict[int, tuple[float, float]]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_group_costs, args=(rank, port, info, reps, out))
             for rank in range(2)]
    for proc in procs:
        proc.start()
    result = out.get(timeout=600)
    for proc in procs:
        proc.join()
    return result


def main() -> int:
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    load_before = os.getloadavg()[0]
    times, agreement, info = served_steps(args)
    costs = group_costs(info, args.reps)
    load_after = os.getloadavg()[0]
    m, n = medians(times), args.tensor_parallel
    rows = []
    for b in BATCH_SIZES:
        one, many = f"1 rank, batch {b}", f"{n} ranks, batch {b}"
        reduce_s, send_s = costs[b]
        rows.append([b, f"{m[one] * 1e3:.1f} (IQR {iqr(times[one]) * 1e3:.1f})",
                     f"{m[many] * 1e3:.1f} (IQR {iqr(times[many]) * 1e3:.1f})", f"**{m[many] / m[one]:.2f}**",
                     f"{reduce_s * 1e3:.1f}", f"{send_s * 1e3:.2f}"])
    table = markdown_table(["batch", "1 process, ms", f"TP={n}, ms", f"TP={n} ÷ 1", f"(b) {2 * info.num_layers} "
                            "all-reduces, ms", "(b) request broadcast, ms"], rows)
    sections = [
        f"{info.model_name} on {info.device} ({info.attention_backend} attention), {info.dtype}, one torch thread "
        f"per rank, {args.context}-token contexts on pages of {info.page_size}, decode steps through ZeroMQ (`top_k` "
        f"1), median of {args.reps} interleaved reps after {args.warmup} warmup. Load average {load_before:.2f} "
        f"before, {load_after:.2f} after, on {os.cpu_count()} cores (the ranks share them with each other and the "
        "machine's other work).",
        table,
        f"- top-1 tokens of TP={n} and one process agree on {agreement:.0%} of the timed steps' sequences",
        f"- (b) is the group's own cost per step, timed alone in two processes: {2 * info.num_layers} all-reduces "
        f"of [batch, {info.hidden_size}] {info.dtype} ({BACKENDS[args.device]}) and one `broadcast_object_list` "
        "of the step's request (gloo)",
    ]
    name = "tensor_parallel" + ("_cuda" if args.device == "cuda" else "")
    path = write_results(name, f"Tensor parallelism: TP={n} ÷ one process", sections)
    print("\n\n".join(sections))
    print(f"\nwritten to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
