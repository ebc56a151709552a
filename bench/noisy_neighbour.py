"""Noisy neighbour: one client's decode, alone and beside another client's hostile instances.

One ControlLoop in this process over a real inference process (``--model``, one torch thread), two
clients. ``alice`` runs ``--instances`` `text-completion` × ``--tokens`` tokens, first alone, then while
``mallory`` keeps ``--hostile`` instances of issue 40's kinds running, each relaunched as it ends: starts
that spin to the slice deadline (row 2), components of 100 memories (row 4), memories that grow until
they may not (rows 5-6), 60 MiB tokenizes (row 2), and KvPage hoarders that sit idle on a quarter of
the pool (row 7). Alice's time per output token is taken from when the inference process's reply
settles each of her token futures (consecutive tokens of one instance); the table gives its p50 and
p99 in both runs and their ratio, checks that her tokens are the same, and reports the control
process's RSS (this process) and mallory's runner's peak RSS.

Goal (issue 40): alice's TPOT p99 beside mallory ≤ 1.5× alone, every token the same. Writes
``results/noisy_neighbour.md``.

    .venv/bin/python bench/noisy_neighbour.py [--model tiny] [--instances 16] [--tokens 64] [--hostile 64]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import (TokenTimes, alice_decodes, doc_parser, machine_lines, markdown_table,  # noqa: E402
                      percentile, write_results)

from oven.client.paths import inferlets_dir  # noqa: E402
from oven.control.config import ControlConfig  # noqa: E402
from oven.control.inference_process import start_inference_process  # noqa: E402
from oven.control.runtime.loop import ControlLoop  # noqa: E402
from oven.control.runtime.programs import LIBRARY  # noqa: E402
from oven.inference.config import InferenceConfig  # noqa: E402
from oven.proto.endpoints import private_endpoint  # noqa: E402

GOAL = 1.5
NUM_PAGES = 1024


def many_memories(folder: Path) -> bytes:
    wat = "(component (core module $m {}) {})".format("(memory 1)" * 10, "(core instance (instantiate $m))" * 10)
    (folder / "many.wat").write_text(wat)
    tools = Path(sys.executable).parent / "wasm-tools"
    subprocess.run([tools, "parse", folder / "many.wat", "-o", folder / "many.wasm"], check=True)
    return (folder / "many.wasm").read_bytes()


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    parser = doc_parser(__doc__)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--instances", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--hostile", type=int, default=64)
    args = parser.parse_args()
    times = TokenTimes()
    config = InferenceConfig(model=args.model, endpoint=private_endpoint(), num_kv_pages=NUM_PAGES, torch_threads=1)
    with tempfile.TemporaryDirectory(prefix="oven-noisy-") as root, \
            start_inference_process(config, timeout_s=600) as inference:
        events: list = []
        loop = ControlLoop(inference.client(), ControlConfig(program_dir=str(Path(root) / "programs"),
                                                             client_memory_mib=1024),
                           lambda inst, kind, payload: events.append((inst.instance_id, kind, payload)))
        loop.events = events
        for name in ("text-completion", "hostile"):
            loop.programs.add((inferlets_dir() / name / f"{name}.wasm").read_bytes(), name, namespace=LIBRARY)
        many = loop.programs.add(many_memories(Path(root)), uploader="mallory")
        kinds = [("hostile", ["spin"]), (many, []), ("hostile", ["hoard"]), ("hostile", ["tokenize", str(60 << 10)]),
                 ("hostile", ["hold-kv", str(NUM_PAGES // 4 // (args.hostile // 5 + 1)), "0"])]
        print("warm-up and alice alone ...", flush=True)
        alice_decodes(loop, times, args.instances, args.tokens, lambda: None)
        alone_gaps, alone_out, _ = alice_decodes(loop, times, args.instances, args.tokens, lambda: None)
        control_before = rss_mib(os.getpid())
        hostile: list = []
        peak = {"runner": 0.0}

        def keep_mallory_busy() -> None:
            hostile[:] = [h for h in hostile if h.alive]
            while len(hostile) < args.hostile:
                program, hostile_args = kinds[len(hostile) % len(kinds)]
                hostile.append(loop.launch(program, hostile_args, owner="mallory"))
            peak["runner"] = max(peak["runner"], rss_mib(hostile[0].runner.pid))

        print(f"alice beside {args.hostile} hostile instances of mallory ...", flush=True)
        keep_mallory_busy()
        loop.run_until(lambda: keep_mallory_busy() or False, 3)  # let mallory settle in
        noisy_gaps, noisy_out, _ = alice_decodes(loop, times, args.instances, args.tokens, keep_mallory_busy)
        control_after = rss_mib(os.getpid())
        failures = defaultdict(int)
        for inst in hostile:
            loop.terminate(inst.instance_id, "bench over")
        for record in loop.finished.values():
            if record.owner == "mallory" and record.error:
                failures[record.error.split(":")[0][:60]] += 1
        loop.close()
    same = noisy_out == alone_out
    p99_alone, p99_noisy = percentile(alone_gaps, 99), percentile(noisy_gaps, 99)
    ratio = p99_noisy / p99_alone
    rows = [["alone", f"{percentile(alone_gaps, 50):.2f}", f"{p99_alone:.2f}", len(alone_gaps), "", ""],
            [f"beside {args.hostile} hostile", f"{percentile(noisy_gaps, 50):.2f}", f"{p99_noisy:.2f}",
             len(noisy_gaps), f"{ratio:.2f}x", "yes" if same else "NO"]]
    table = markdown_table(["alice's run", "TPOT p50 ms", "TPOT p99 ms", "gaps", "p99 ratio", "same tokens"], rows)
    verdict = "meets" if ratio <= GOAL and same else "misses"
    sections = [
        f"Model `{args.model}`, alice: {args.instances} × `text-completion` × {args.tokens} tokens; mallory: "
        f"{args.hostile} hostile instances (spin, 100 memories, hoard, 60 MiB tokenize, KV hoarders), "
        "relaunched as they end.",
        table,
        f"Goal: p99 ratio ≤ {GOAL}x with the same tokens: **{verdict}** ({ratio:.2f}x). Control process RSS "
        f"{control_before:.0f} → {control_after:.0f} MiB; mallory's runner peaked at {peak['runner']:.0f} MiB RSS.",
        "How mallory's instances ended: " + ", ".join(f"{n} × {why}" for why, n in sorted(failures.items())),
    ]
    print("\n\n".join(["\n".join(machine_lines()), *sections]))
    print(f"wrote {write_results('noisy_neighbour', 'Noisy neighbour (issue 40)', sections)}")


if __name__ == "__main__":
    main()
