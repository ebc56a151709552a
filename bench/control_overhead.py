"""Control-layer overhead (Pie §7.4, Table 5) against a FAKE inference backend.

The inference process here is ``bench/fake_inference.py``: the real protocol
over ZeroMQ, no model, every batch "runs" for ``--base-ms + --per-item-ms x
items`` of sleep. With the device simulated, what is left to measure is the
control process: wasmtime, the host imports, the batch scheduler and the
client. Four parts, all in one run against one fake backend:

(a) API calls the control layer answers (``runtime.now-ms``, ``tokenize.tokenize``
    of a 10-token sentence, ``futures.poll`` of one pending future, and a guest
    function that does nothing as the floor), timed *inside* the inferlet
    ``bench-calls`` in blocks of calls, with ``--api-instances`` (256) instances
    running at once; each instance reports its median ns per call.
    Goal: median <= 30 us (Pie: under 30 us at 896 instances).
(b) Control CPU per generated token of ``hello-python`` (the raw-API greedy loop:
    embed-text, forward, get-next-dist per token) with 1, 32 and 128 instances:
    CPU time of the loop thread (``time.thread_time``, launch included) and of
    the whole process (``time.process_time``: adds ZeroMQ's I/O thread and the
    epoch ticker) over tokens generated. The fake runs in another process, so
    none of its time is counted. Goal: <= 150 us per token.
(c) Warm launch (program compiled and cached): ``bench-calls ack`` sends a
    message in its first slice. 256 launched at once; per instance, service time =
    its ``launch()`` + its first slice, and end-to-end = from the burst's start to
    its message (Pie's measure, which includes waiting behind the others on the
    one loop thread). Goal: service p50 <= 10 ms, p99 <= 50 ms.
(d) Throughput of ``--tp-instances`` (128) ``hello-python`` decode loops under each
    dispatch policy (adaptive, eager, k, t), one fresh ControlLoop per policy, all
    against the same fake device. Goal: adaptive >= 10x eager and above k and t.

    .venv/bin/python bench/control_overhead.py              # all parts, about 3.5 minutes on 2 cores
    .venv/bin/python bench/control_overhead.py --parts d --profile
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import pstats
import resource
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import doc_parser, machine_lines, markdown_table, write_results  # noqa: E402
from fake_inference import FakeDeviceConfig, FakeInferenceProcess, real_tokenizer  # noqa: E402

from oven.client.paths import inferlets_dir  # noqa: E402
from oven.control.config import ControlConfig, default_program_dir  # noqa: E402
from oven.control.inference_client import InferenceClient  # noqa: E402
from oven.proto.endpoints import private_endpoint  # noqa: E402
from oven.control.runtime.loop import ControlLoop  # noqa: E402
from oven.control.serve import settle_heap  # noqa: E402
from oven.proto import inference as p  # noqa: E402

API_GOAL_US, CPU_GOAL_US, LAUNCH_P50_GOAL_MS, LAUNCH_P99_GOAL_MS = 30.0, 150.0, 10.0, 50.0
API_OPS = ("baseline", "now-ms", "poll", "tokenize")
PROGRAMS = ("hello-python", "hello-rust", "text-completion", "text-completion-rust", "bench-calls")
PROMPT = "Write a short story about a paged KV cache."


def parse_args() -> argparse.Namespace:
    parser = doc_parser(__doc__)
    add = parser.add_argument
    add("--parts", nargs="+", default=list("abcd"), choices=list("abcd"), help="which parts to run (default: all)")
    add("--base-ms", type=float, default=5.0, help="fake device ms per batch (default %(default)s)")
    add("--per-item-ms", type=float, default=0.05, help="fake device ms per batch item (default %(default)s)")
    add("--api-instances", type=int, default=256, help="(a) concurrent instances (default %(default)s)")
    add("--api-reps", type=int, default=10, help="(a) timed blocks per instance (default %(default)s)")
    add("--api-block", type=int, default=100, help="(a) calls per timed block (default %(default)s)")
    add("--cpu-instances", type=int, nargs="+", default=[1, 32, 128], help="(b) instance counts (default 1 32 128)")
    add("--cpu-tokens", type=int, default=64, help="(b) tokens per instance (default %(default)s)")
    add("--launch-instances", type=int, default=256, help="(c) instances launched at once (default %(default)s)")
    add("--tp-instances", type=int, default=128, help="(d) concurrent decode loops (default %(default)s)")
    add("--tp-tokens", type=int, default=32, help="(d) tokens per decode loop (default %(default)s)")
    add("--tp-rounds", type=int, default=2, help="(d) round-robin rounds; the median run is kept (default %(default)s)")
    add("--k", type=int, default=32, help="(d) batch size of the k policy (default %(default)s)")
    add("--t-ms", type=float, default=5.0, help="(d) wait of the t policy (default %(default)s)")
    add("--profile", action="store_true", help="(d) cProfile the adaptive run and print the top entries")
    add("--program-dir", default=str(Path(default_program_dir()).parent / "bench-programs"),
        help="program store with its compiled-code cache (default %(default)s)")
    return parser.parse_args()


class Bench:
    """One fake backend; control loops over it, each recording its events with a timestamp."""

    def __init__(self, endpoint: str, program_dir: str):
        self.endpoint = endpoint
        self.config = ControlConfig(program_dir=program_dir, instance_memory_mib=256)
        self.events: dict[str, list[tuple[float, str, object]]] = {}

    def loop(self, **overrides) -> ControlLoop:
        self.events.clear()  # instance ids restart at 1 in every loop
        loop = ControlLoop(InferenceClient(self.endpoint), replace(self.config, **overrides), self._record)
        for name in PROGRAMS:
            loop.programs.add((inferlets_dir() / name / f"{name}.wasm").read_bytes(), name)
        return loop

    def _record(self, inst, kind: str, payload: object) -> None:
        self.events.setdefault(inst.instance_id, []).append((time.perf_counter(), kind, payload))

    def messages(self, inst) -> list[tuple[float, str]]:
        return [(t, payload) for t, kind, payload in self.events.get(inst.instance_id, ()) if kind == "message"]

    @staticmethod
    def run_all(loop: ControlLoop, instances, timeout_s: float = 600) -> None:
        if not loop.run_until(lambda: not any(i.alive for i in instances), timeout_s):
            raise TimeoutError(f"instances still running after {timeout_s} s")
        failed = [i for i in instances if i.exit_code != 0]
        if failed:
            raise RuntimeError(f"{len(failed)} instances failed, first: {failed[0].error}")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def verdict(ok: bool) -> str:
    return "met" if ok else "**missed**"


def part_api(bench: Bench, loop: ControlLoop, args) -> str:
    rows = []
    for op in API_OPS:
        start = time.perf_counter()
        instances = [loop.launch("bench-calls", ["calls", op, str(args.api_reps), str(args.api_block)])
                     for _ in range(args.api_instances)]
        bench.run_all(loop, instances)
        wall = time.perf_counter() - start
        per_call_us = [float(bench.messages(i)[0][1].split()[1]) / 1000 for i in instances]
        median = statistics.median(per_call_us)
        goal = "floor" if op == "baseline" else verdict(median <= API_GOAL_US)
        rows.append([op, f"{median:.2f}", f"{pct(per_call_us, 0.99):.2f}", f"{wall:.1f}", goal])
        print(f"(a) {op:9s} median {median:8.2f} us/call  p99 {pct(per_call_us, 0.99):8.2f}  [{goal}]", flush=True)
    head = (f"### (a) Control-handled API calls, timed inside the inferlet\n\n{args.api_instances} instances at once, "
            f"each timing {args.api_reps} blocks of {args.api_block} calls (median per instance); the table gives "
            f"the median and p99 over instances. Goal: median <= {API_GOAL_US:.0f} us.\n\n")
    return head + markdown_table(["call", "median us/call", "p99 us/call", "wall s", "goal"], rows)


def wake_penalty(sleep_s: float, reps: int = 300) -> tuple[float, float]:
    """Median thread CPU (us) of one fixed piece of the loop's own work, run back to back and right after a sleep.

    The work is what a reply costs the loop: decode a one-item ForwardTextReply, ten times (~30 us warm). With
    one instance the loop sleeps through every device step, so each token's work starts after such a sleep.
    """
    reply = p.CODEC.encode(p.ForwardTextReply([None], [[p.TopKDist(b"\x01\x00\x00\x00", b"\x00\x00\x80?")]]), 7)

    def work() -> int:
        start = time.thread_time_ns()
        for _ in range(10):
            p.CODEC.decode(reply)
        return time.thread_time_ns() - start
    warm, after_sleep = [], []
    for _ in range(reps):
        warm.append(work())
        time.sleep(sleep_s)
        after_sleep.append(work())
    return statistics.median(warm) / 1e3, statistics.median(after_sleep) / 1e3


def part_cpu(bench: Bench, loop: ControlLoop, args) -> str:
    rows = []
    # The raw-API loops, step by step (three calls, or one fused), and the SDKs' pipelined ``generate``:
    # the server samples and the next step is in flight while the inferlet handles a token.
    variants = [(program, flags) for program in ("hello-python", "hello-rust") for flags in ([], ["--fused"])] + \
        [("text-completion", []), ("text-completion-rust", [])]
    for (program, extra), num in [(v, n) for v in variants for n in args.cpu_instances]:
        code0 = loop.wasm_clock.inferlet_code_s
        thread0, proc0, wall0 = time.thread_time(), time.process_time(), time.perf_counter()
        instances = [loop.launch(program, [PROMPT, str(args.cpu_tokens), *extra]) for _ in range(num)]
        program = " ".join([program, *extra])
        launch_thread = time.thread_time() - thread0
        bench.run_all(loop, instances)
        thread, proc, wall = time.thread_time() - thread0, time.process_time() - proc0, time.perf_counter() - wall0
        # The slices run in the client's runner process: their CPU (guest code and the host calls answered
        # there) counts as the loop thread's did when they ran on it.
        slices = sum(inst.cpu_ns for inst in instances) / 1e9
        thread, proc = thread + slices, proc + slices
        code = loop.wasm_clock.inferlet_code_s - code0
        tokens = num * args.cpu_tokens
        # Time per output token of each instance, launch to exit, against the fake device's batch time.
        tpot_ms, step_ms = wall / args.cpu_tokens * 1e3, args.base_ms + args.per_item_ms * num
        thread_us, proc_us, code_us = (x / tokens * 1e6 for x in (thread, proc, code))
        control_us, steady_us = thread_us - code_us, (thread - launch_thread - code) / tokens * 1e6
        rows.append([program, num, tokens, f"{thread_us:.0f}", f"{code_us:.0f}", f"{control_us:.0f}", f"{steady_us:.0f}",
                     f"{proc_us:.0f}", f"{tokens / wall:.0f}", f"{tpot_ms:.2f}", f"{tpot_ms / step_ms:.2f}x",
                     f"{thread / wall:.0%}", verdict(control_us <= CPU_GOAL_US)])
        print(f"(b) {program:20s} {num:4d} instances: loop thread {thread_us:4.0f} us/token = inferlet code {code_us:4.0f} "
              f"+ control layer {control_us:4.0f} (after launch() {steady_us:.0f}); process {proc_us:4.0f}; "
              f"{tokens / wall:5.0f} tokens/s, TPOT {tpot_ms:.2f} ms ({tpot_ms / step_ms:.2f}x the step), "
              f"loop thread busy {thread / wall:.0%}", flush=True)
    warm_us, cold_us = wake_penalty(args.base_ms / 1000)
    wake = (f"Wake-up cost of this machine: the same {warm_us:.0f} us of the loop's work (decoding replies) takes "
            f"{cold_us:.0f} us ({cold_us / warm_us:.1f}x) when it starts right after a {args.base_ms:g} ms sleep, "
            "as every token's work does with 1 instance, where the loop sleeps through each device step; "
            "with 32 or 128 instances the loop is busy and runs warm.")
    print(f"(b) {wake}", flush=True)
    head = (f"### (b) Control CPU per generated token, `hello-python` and `hello-rust` (raw API, step by step) and "
            f"`text-completion` and `text-completion-rust` (the SDKs' pipelined `generate`), {args.cpu_tokens} tokens "
            "each\n\n"
            "Loop thread = `time.thread_time()` of the thread running the ControlLoop, launches included. It runs the "
            "inferlets' own code too: *inferlet code* is the time inside their wasm minus the host calls it made "
            "(`ControlLoop.wasm_clock`), and *control layer* is the rest: host calls, value conversion, the batch "
            "scheduler, the protocol and the loop (the next column leaves out the `launch()` calls). Process = "
            "`time.process_time()` (adds ZeroMQ's I/O thread and the epoch ticker). TPOT = an instance's wall time, "
            "launch to exit, per token; ÷ step = against the fake device's batch time (issue 15: ≤ 1.04x at 1 "
            "instance). "
            f"Goal: control layer <= {CPU_GOAL_US:.0f} us per token.\n\n")
    return head + markdown_table(["inferlet", "instances", "tokens", "loop thread us/token", "inferlet code",
                                  "control layer", "control, without launch()", "process us/token", "tokens/s",
                                  "TPOT ms", "÷ step", "loop thread busy", "goal"], rows) + "\n\n" + wake


def part_launch(bench: Bench, loop: ControlLoop, args) -> str:
    num = args.launch_instances
    warm = loop.launch("bench-calls", ["ack"])  # the first launch in a loop deserializes the compiled code
    if not loop.run_until(lambda: bench.messages(warm), 60):
        raise TimeoutError("the warm-up instance sent no ack")
    start = time.perf_counter()
    instances, launch_s = [], []
    for _ in range(num):
        t = time.perf_counter()
        instances.append(loop.launch("bench-calls", ["ack"]))
        launch_s.append(time.perf_counter() - t)
    first_slice_at = time.perf_counter()
    if not loop.run_until(lambda: all(bench.messages(i) for i in instances), 120):
        raise TimeoutError("not every instance sent its ack")
    acked = [bench.messages(i)[0][0] for i in instances]
    previous = [first_slice_at] + acked[:-1]  # first slices run back to back, in launch order
    service_ms = [(ls + a - p) * 1e3 for ls, a, p in zip(launch_s, acked, previous)]
    end_to_end_ms = [(a - start) * 1e3 for a in acked]
    for inst in [warm, *instances]:
        loop.kill(inst, "benchmark over", 0)
    p50, p99 = pct(service_ms, 0.5), pct(service_ms, 0.99)
    ok = p50 <= LAUNCH_P50_GOAL_MS and p99 <= LAUNCH_P99_GOAL_MS
    rows = [["service: launch() + first slice", f"{p50:.2f}", f"{p99:.2f}", f"{max(service_ms):.2f}", verdict(ok)],
            ["  of which launch()", f"{pct(launch_s, 0.5) * 1e3:.2f}", f"{pct(launch_s, 0.99) * 1e3:.2f}",
             f"{max(launch_s) * 1e3:.2f}", ""],
            ["end-to-end from the burst's start", f"{pct(end_to_end_ms, 0.5):.1f}", f"{pct(end_to_end_ms, 0.99):.1f}",
             f"{max(end_to_end_ms):.1f}", "(Pie's measure)"]]
    print(f"(c) warm launch of {num} at once: service p50 {p50:.2f} ms p99 {p99:.2f} ms [{verdict(ok)}]; "
          f"end-to-end p50 {pct(end_to_end_ms, 0.5):.0f} ms p99 {pct(end_to_end_ms, 0.99):.0f} ms", flush=True)
    head = (f"### (c) Warm launch, {num} at once (`bench-calls ack`)\n\nGoal: service p50 <= "
            f"{LAUNCH_P50_GOAL_MS:.0f} ms, p99 <= {LAUNCH_P99_GOAL_MS:.0f} ms.\n\n")
    return head + markdown_table(["ms", "p50", "p99", "max", "goal"], rows)


def run_policy(bench: Bench, policy: str, args, profile: bool) -> dict:
    loop = bench.loop(dispatch_policy=policy, dispatch_k=args.k, dispatch_t_ms=args.t_ms)
    try:
        profiler = cProfile.Profile() if profile else None
        thread0, wall0 = time.thread_time(), time.perf_counter()
        if profiler:
            profiler.enable()
        instances = [loop.launch("hello-python", [PROMPT, str(args.tp_tokens)]) for _ in range(args.tp_instances)]
        bench.run_all(loop, instances)
        if profiler:
            profiler.disable()
        wall, thread = time.perf_counter() - wall0, time.thread_time() - thread0
        stats = loop.replicas[0].scheduler.stats()
    finally:
        loop.close()
    device_s = (stats.num_batches * args.base_ms + stats.num_commands * args.per_item_ms) / 1e3
    result = {"policy": policy, "wall": wall, "tokens": args.tp_instances * args.tp_tokens, "thread": thread,
              "batches": stats.num_batches, "mean_batch": stats.mean_batch_size, "device_s": device_s,
              "wait_ms": stats.mean_wait_s * 1e3}
    if profiler:
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(15)
        result["profile"] = out.getvalue()
    return result


def part_throughput(bench: Bench, args) -> str:
    names = {"adaptive": "adaptive", "eager": "eager", "k": f"k={args.k}", "t": f"t={args.t_ms:g} ms"}
    runs: dict[str, list[dict]] = {policy: [] for policy in names}
    for round_idx in range(args.tp_rounds):  # round-robin, so drift hits every policy alike
        for policy in names:
            r = run_policy(bench, policy, args, profile=False)
            runs[policy].append(r)
            gc.collect()
            print(f"(d) round {round_idx + 1} {names[policy]:9s} {r['tokens'] / r['wall']:7.0f} tokens/s  "
                  f"{r['batches']:5d} batches of {r['mean_batch']:5.1f}  fake device busy "
                  f"{r['device_s'] / r['wall']:4.0%}  loop thread busy {r['thread'] / r['wall']:4.0%}", flush=True)
    results = {policy: sorted(rs, key=lambda r: r["wall"])[(len(rs) - 1) // 2] for policy, rs in runs.items()}
    adaptive = results["adaptive"]["tokens"] / results["adaptive"]["wall"]
    rows = []
    for policy, r in results.items():
        tps = r["tokens"] / r["wall"]
        rows.append([names[policy], f"{tps:.0f}", f"{args.tp_instances / r['wall']:.2f}", f"{adaptive / tps:.2f}x",
                     r["batches"], f"{r['mean_batch']:.1f}", f"{r['wait_ms']:.1f}", f"{r['device_s'] / r['wall']:.0%}",
                     f"{r['thread'] / r['wall']:.0%}"])
    vs_eager = adaptive / (results["eager"]["tokens"] / results["eager"]["wall"])
    best_other = max(results[p]["tokens"] / results[p]["wall"] for p in ("k", "t"))
    ok = vs_eager >= 10 and adaptive > best_other
    summary = (f"adaptive / eager = **{vs_eager:.2f}x**, adaptive / best of k and t = **{adaptive / best_other:.2f}x** "
               f"[{verdict(ok)}]")
    print(f"(d) {summary}", flush=True)
    if args.profile:  # a separate, untimed run: the profiler slows the loop down
        profiled = run_policy(bench, "adaptive", args, profile=True)
        print("(d) cProfile of an extra adaptive run, top entries by own time:\n" + profiled["profile"])
    head = (f"### (d) Throughput by dispatch policy, {args.tp_instances} `hello-python` loops x {args.tp_tokens} "
            f"tokens, median of {args.tp_rounds} rounds\n\nGoal: adaptive >= 10x eager and above k and t (Pie Table 5). Fake device busy = simulated "
            "device time / wall time; loop thread busy = its CPU time / wall time.\n\n")
    table = markdown_table(["policy", "tokens/s", "requests/s", "adaptive / this", "batches", "mean batch",
                            "mean wait ms", "fake device busy", "loop thread busy"], rows)
    return head + table + "\n\n" + summary


def main() -> int:
    args = parse_args()
    device = FakeDeviceConfig(base_ms=args.base_ms, per_item_ms=args.per_item_ms)
    intro = (f"FAKE inference backend (`bench/fake_inference.py`): each batch sleeps {args.base_ms:g} ms + "
             f"{args.per_item_ms:g} ms per item and returns a fixed top-1 distribution; SmolLM2 tokenizer. "
             "Everything measured here is the control process.")
    print("\n".join(machine_lines()) + "\n" + intro, flush=True)
    with FakeInferenceProcess(private_endpoint(), device, real_tokenizer()) as fake:
        bench = Bench(fake.endpoint, args.program_dir)
        settle_heap()  # what `oven serve` does once it has started
        sections = [intro]
        for part, run in (("a", part_api), ("b", part_cpu), ("c", part_launch)):
            if part in args.parts:  # a fresh loop per part: finished instances stay in loop.finished
                loop = bench.loop()
                try:
                    sections.append(run(bench, loop, args))
                finally:
                    loop.close()
                del loop
                gc.collect()
        if "d" in args.parts:
            sections.append(part_throughput(bench, args))
    sections.append(f"Peak RSS of the control process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB.")
    print(sections[-1])
    print(f"\nwrote {write_results('control_overhead', 'Control-layer overhead (fake inference backend)', sections)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
