"""Data parallel serving: throughput of one control loop over two inference replicas against one.

(a) FAKE devices (``bench/fake_inference.py``: the real protocol, each batch sleeps ``base + per_item x
    items`` ms, so the two cores are not the device): ``--instances`` concurrent ``text-completion`` runs
    of ``--tokens`` tokens each, on one replica and on two, side by side (alternating, ``--rounds``
    each; medians), for each cost model of ``--costs``. Reported: tokens/s, DP=2 / DP=1 (goal >= 1.8),
    and how full each replica's batches are: mean items per batch / instances on that replica (goal:
    DP=2's >= 0.9 x DP=1's). The ideal ratio of each cost model is printed beside the measured one:
    with a large fixed cost per batch two half batches cost nearly what one full one does, and where
    the control process and the runner (one, for one client) cannot keep up with the device, a second
    replica cannot help either; a second replica pays only where the device is the limit.
(b) SmolLM2 on this machine's CPU, one torch thread per replica: the same runs, DP=2 / DP=1 (no goal:
    the cores are shared with the control process and the runners).
(c) The device alone, no control process: two inference processes of ``--model`` on ``--device``
    (on CUDA both on one GPU, as ``gpu_check.sh`` runs it where there is one) each decoding
    ``--batch`` / 2 sequences step after step, at the same time, against one process decoding
    ``--batch``: tokens/s of each side and the ratio (what a second replica gains on the same device).

Writes bench/results/data_parallel.md.
"""

from __future__ import annotations

import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import (RESULTS_DIR, PagedBatch, check_reply, doc_parser, machine_lines,  # noqa: E402
                      markdown_table, text_prompts)

from oven.client.paths import inferlets_dir  # noqa: E402
from oven.control.config import ControlConfig, default_program_dir  # noqa: E402
from oven.control.inference_client import InferenceClient  # noqa: E402
from oven.control.inference_process import start_inference_process  # noqa: E402
from oven.inference.config import DEFAULT_MODEL, InferenceConfig  # noqa: E402
from oven.proto.endpoints import private_endpoint  # noqa: E402

PROGRAM = "text-completion"
SPEEDUP_GOAL, FILL_GOAL = 1.8, 0.9


def parse_args():
    parser = doc_parser(__doc__)
    add = parser.add_argument
    add("--parts", nargs="+", default=["a", "b"], choices=["a", "b", "c"],
        help="which parts to run (default: a and b)")
    add("--instances", type=int, default=64, help="concurrent runs (default %(default)s)")
    add("--tokens", type=int, default=64, help="tokens per run (default %(default)s)")
    add("--rounds", type=int, default=3, help="runs of each side, alternating; medians kept (default %(default)s)")
    add("--costs", nargs="+", default=["2:0.5", "10:4"], metavar="BASE:PER_ITEM",
        help="(a) fake devices, each ms per batch : ms per item (default: %(default)s)")
    add("--real-instances", type=int, default=16, help="(b) concurrent runs on SmolLM2 (default %(default)s)")
    add("--real-tokens", type=int, default=32, help="(b) tokens per run on SmolLM2 (default %(default)s)")
    add("--model", default=DEFAULT_MODEL, help="(c) model (default %(default)s)")
    add("--device", default="cpu", help="(c) device of both processes (default %(default)s)")
    add("--dtype", default="auto", help="(c) dtype (default %(default)s)")
    add("--batch", type=int, default=32, help="(c) sequences decoded in all (default %(default)s)")
    add("--seconds", type=float, default=10.0, help="(c) decode time of each side and round (default %(default)s)")
    add("--program-dir", default=str(Path(default_program_dir()).parent / "bench-programs"),
        help="program store with its compiled-code cache (default %(default)s)")
    return parser.parse_args()


def one_run(clients: list[InferenceClient], program_dir: str, instances: int, tokens: int) -> dict:
    """``instances`` runs at once over ``clients`` (one per replica): tokens/s and each replica's fill."""
    from oven.control.runtime.loop import ControlLoop  # (wasmtime: parts a and b only; c runs where it is not)

    loop = ControlLoop(clients, ControlConfig(program_dir=program_dir, instance_memory_mib=256), lambda *_: None)
    try:
        loop.programs.add((inferlets_dir() / PROGRAM / f"{PROGRAM}.wasm").read_bytes(), PROGRAM)
        start = time.perf_counter()
        launched = [loop.launch(PROGRAM, [f"Story {i}: once upon a time", str(tokens)]) for i in range(instances)]
        if not loop.run_until(lambda: not any(i.alive for i in launched), 900):
            raise TimeoutError("runs still going after 900 s")
        wall = time.perf_counter() - start
        failed = [i for i in launched if i.exit_code != 0]
        if failed:
            raise RuntimeError(f"{len(failed)} runs failed, first: {failed[0].error}")
        fills = []
        for replica in loop.replicas:
            here = sum(1 for i in launched if i.replica is replica)
            fills.append(replica.scheduler.stats().mean_batch_size / here)
        return {"tok_s": instances * tokens / wall, "fill": min(fills), "items": [
            r.scheduler.stats().mean_batch_size for r in loop.replicas]}
    finally:
        loop.close()


def compare(make_clients, args, instances: int, tokens: int, label: str) -> tuple[dict, dict]:
    """DP=1 and DP=2 alternating; the median of each side's tokens/s and fill."""
    runs = {1: [], 2: []}
    for round_ in range(args.rounds):
        for dp in (1, 2):
            with ExitStack() as stack:
                clients = [stack.enter_context(c) for c in make_clients(dp)]
                result = one_run(clients, args.program_dir, instances, tokens)
            runs[dp].append(result)
            print(f"{label} round {round_ + 1} DP={dp}: {result['tok_s']:8.1f} tok/s, items per batch "
                  f"{', '.join(f'{x:.1f}' for x in result['items'])}", flush=True)
    return tuple({key: statistics.median(r[key] for r in runs[dp]) for key in ("tok_s", "fill")} for dp in (1, 2))


def part_fake(args) -> list[str]:
    from fake_inference import FakeDeviceConfig, FakeInferenceProcess, real_tokenizer

    tokenizer, lines = real_tokenizer(), []
    for cost in args.costs:
        base_ms, per_item_ms = map(float, cost.split(":"))
        device = FakeDeviceConfig(base_ms=base_ms, per_item_ms=per_item_ms)
        with ExitStack() as stack:
            fakes = [stack.enter_context(FakeInferenceProcess(private_endpoint(), device, tokenizer)) for _ in range(2)]
            one, two = compare(lambda dp: [InferenceClient(f.endpoint) for f in fakes[:dp]], args, args.instances,
                               args.tokens, f"(a) {cost}")
        step = lambda n: base_ms + per_item_ms * n  # noqa: E731
        ideal = 2 * (args.instances / 2) / step(args.instances / 2) / (args.instances / step(args.instances))
        speedup, fill = two["tok_s"] / one["tok_s"], two["fill"] / one["fill"]
        lines += [f"## (a) FAKE device: {args.instances} runs x {args.tokens} tokens, each batch {base_ms:g} ms + "
                  f"{per_item_ms:g} ms per item (device-bound at DP=1: {1000 * args.instances / step(args.instances):.0f} "
                  "tokens/s at most)", "",
                  markdown_table(["", "DP=1", "DP=2", "DP=2 / DP=1", "goal"], [
                      ["tokens/s", f"{one['tok_s']:.0f}", f"{two['tok_s']:.0f}", f"{speedup:.2f}",
                       f">= {SPEEDUP_GOAL} ({'met' if speedup >= SPEEDUP_GOAL else '**missed**'}); the cost model's "
                       f"ideal {ideal:.2f}"],
                      ["batch fill (items per batch / instances on the replica; the emptier replica)",
                       f"{one['fill']:.2f}", f"{two['fill']:.2f}", f"{fill:.2f}",
                       f">= {FILL_GOAL} ({'met' if fill >= FILL_GOAL else '**missed**'})"]]), ""]
    return lines


def part_real(args) -> list[str]:
    config = InferenceConfig(model=DEFAULT_MODEL, torch_threads=1)
    with ExitStack() as stack:
        processes = [stack.enter_context(start_inference_process(config.replace(endpoint=private_endpoint()), 600))
                     for _ in range(2)]
        one, two = compare(lambda dp: [p.client() for p in processes[:dp]], args, args.real_instances,
                           args.real_tokens, "(b)")
    return [f"## (b) {DEFAULT_MODEL} on the CPU: {args.real_instances} runs x {args.real_tokens} tokens, one torch "
            "thread per replica", "",
            markdown_table(["", "DP=1", "DP=2", "DP=2 / DP=1"], [
                ["tokens/s", f"{one['tok_s']:.1f}", f"{two['tok_s']:.1f}", f"{two['tok_s'] / one['tok_s']:.2f}"],
                ["batch fill", f"{one['fill']:.2f}", f"{two['fill']:.2f}", f"{two['fill'] / one['fill']:.2f}"]]), ""]


def decode_for(client: InferenceClient, batch: PagedBatch, size: int, seconds: float) -> int:
    """Decode steps of ``size`` sequences for ``seconds``; how many tokens."""
    request, steps, end = batch.decode_request(size), 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        check_reply(client.call(request))
        steps += 1
    return steps * size


def part_device(args) -> list[str]:
    config = InferenceConfig(model=args.model, device=args.device, dtype=args.dtype, num_kv_pages=1024,
                             torch_threads=1 if args.device == "cpu" else None)
    half = args.batch // 2
    with ExitStack() as stack:
        processes = [stack.enter_context(start_inference_process(config.replace(endpoint=private_endpoint()), 900))
                     for _ in range(2)]
        clients = [stack.enter_context(p.client()) for p in processes]
        info = clients[0].info()
        batch = PagedBatch(text_prompts(info.tokenizer.tokenizer_json, args.batch, 64), info.page_size)
        for client in clients:  # both hold every prompt: either side may decode any of them
            for request in batch.prefill_requests(info.max_batch_tokens):
                check_reply(client.call(request))
        one, two = [], []
        for _ in range(args.rounds):
            one.append(decode_for(clients[0], batch, args.batch, args.seconds) / args.seconds)
            with ThreadPoolExecutor(2) as pool:  # (the GIL is released while each waits on its socket)
                two.append(sum(pool.map(lambda c: decode_for(c, batch, half, args.seconds), clients)) / args.seconds)
            print(f"(c) round: one process {one[-1]:.1f} tok/s, two {two[-1]:.1f} tok/s", flush=True)
    a, b = statistics.median(one), statistics.median(two)
    return [f"## (c) the device alone: {args.model} on {args.device}, {args.batch} sequences decoded by one process "
            f"or {half} by each of two", "",
            markdown_table(["", "one process", "two processes", "two / one"],
                           [["tokens/s", f"{a:.1f}", f"{b:.1f}", f"{b / a:.2f}"]]), ""]


def main() -> int:
    args = parse_args()
    lines = ["# Data parallel serving (bench/data_parallel.py)", "", *[f"- {m}" for m in machine_lines()],
             f"- {args.rounds} rounds per side, alternating; medians", ""]
    if "a" in args.parts:
        lines += part_fake(args)
    if "b" in args.parts:
        lines += part_real(args)
    if "c" in args.parts:
        lines += part_device(args)
    text = "\n".join(lines)
    print(text)
    RESULTS_DIR.mkdir(exist_ok=True)
    (RESULTS_DIR / "data_parallel.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
