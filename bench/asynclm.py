"""AsyncLM end to end (AsyncLM §6): every mode side by side on BFCL, one embedded server.

For each sample of the BFCL parallel sets (``parallel``, ``live_parallel``) and the
multi-step-parallel set, and each ``--latency-scale`` (the emulated execution times of the
calls multiplied by it, and the estimates announced to the inferlet with them), one session
per mode on the same pinned plan (the scenario's chains), so every mode makes the same calls:

* ``sync`` (KV cache kept while waiting), ``sync-stateless`` (``sync --stateless``: the
  context is re-prefilled after every wait), ``sync-parallel``, ``async-naive``, ``async``
  (trap handler ``kv=auto``) and ``async-keep`` (``async`` with ``kv=keep``, for the KV check).

Modes run round-robin per sample (the order rotates from sample to sample), so drift in the
machine's load falls on every mode alike; with ``--reps`` the fastest session of a mode is kept.
A session that does not make every planned call within ``--max-tokens`` counts as failed.
What is measured, all from the inferlet's trace (instance clock, ms) and the executor's timings:

* latency L: the session's ``wall_ms`` (prompt prefill + calls + ``--answer-tokens`` free tokens);
* call phase: from the first call event to the last result injected (``intr``); sync-parallel
  reports its calls when it dispatches them (at the trap), so its call phase means nothing;
* G of a call: generator time from the previous call event (the session start for the first
  call, so its G holds the prompt prefill) to this call's event, minus the waits (``kv`` event
  to the next event) and the ``[TRAP][END]`` tokens (event before ``trap`` to ``trap``). It
  holds the injection of the interrupts that land in its block. E of a call: executor
  ``finished - started``.
* ideal: list scheduling longest-first (LPT) with one generator and unlimited executors over the
  chains, from the async run's own G and E: the first call written is dispatched at 0 (its G
  and the prefill are the common prefix), then the generator writes the ready call with the
  longest E, or idles until a call finishes. Goal: async's call phase <= 1.10 x ideal.
* Theorem 6.1: async <= sync-parallel on every sample (latency), violations printed.
* Theorem 6.2: speedup sync/async against E/G (E mean of the calls, G mean of the sync run's
  calls after the first), beside 1 + E/G; rows also go to ``results/asynclm_speedup.csv``,
  and the plot of both to ``results/asynclm_speedup.png`` where matplotlib is installed
  (``.venv/bin/pip install -e '.[bench]'``); ``--plot CSV`` redraws it from a saved CSV.
* KV: ``kv_page_ms_saved`` of async (auto) against async-keep, and whether their text is equal
  (where both ran the same schedule).

Prompts list only the functions the plan calls (``--all-functions`` lists the whole tool
classes: ~5,200 prompt tokens on multi-step-parallel, minutes of prefill per session on CPU).

    .venv/bin/python bench/asynclm.py                      # 3 samples per set, scales 1 16
    .venv/bin/python bench/asynclm.py --samples 1 --sets parallel --latency-scale 1 4 16
    .venv/bin/python bench/asynclm.py --raw runs.json ...  # keep the traces; --reanalyse runs.json reports again
    .venv/bin/python bench/asynclm.py --plot bench/results/asynclm_speedup.csv  # only redraw the plot
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from asynclm_report import plot_speedup, read_csv, report
from asynclm_runs import Run
from benchlib import RESULTS_DIR, machine_lines
from oven.client.asynclm.session import Workload, run_session, session_spec
from oven.client.connect import embedded_server  # noqa: E402
from oven.client.programs import library_program  # noqa: E402
from oven.proto.auth import default_state_dir  # noqa: E402
from oven.client.asynclm.tools import ToolRegistry, load_scenarios, parse_call
from oven.client.asynclm.tools.registry import describe_line
from oven.inference.config import DEFAULT_MODEL

MODES = {  # label -> (inferlet mode, extra spec options)
    "sync": ("sync", {}),
    "sync-stateless": ("sync", {"stateless": True}),
    "sync-parallel": ("sync-parallel", {}),
    "async-naive": ("async-naive", {}),
    "async": ("async", {"kv": "auto"}),
    "async-keep": ("async", {"kv": "keep"}),
}
SETS = ("parallel", "live_parallel", "multi_step_parallel")
SETTINGS = ("samples", "sets", "modes", "latency_scale", "reps", "answer_tokens", "max_tokens", "all_functions",
            "model")


def workload(scenario, scale: float, all_functions: bool) -> tuple[Workload, dict]:
    """A fresh registry (multi-step tools are stateful), latencies and estimates x ``scale``."""
    registry: ToolRegistry = scenario.build_registry()
    called = {parse_call(call).name for chain in scenario.chains for call in chain}
    tools = [t for t in registry if all_functions or t.name in called]
    options = {"functions": "\n".join(describe_line(t.signature, t.description, t.latency_ms * scale) for t in tools),
               "estimates_ms": {t.name: t.latency_ms * scale for t in registry}}
    w = Workload(scenario.id, scenario.question, registry, scenario.chains,
                 lambda call, base=registry.latency_s: base(call) * scale)
    return w, options


def run_one(client, program, scenario, kind, scale, label, args) -> Run:
    mode, extra = MODES[label]
    w, options = workload(scenario, scale, args.all_functions)
    longest_s = max(w.latency(c) for chain in w.plan for c in chain)
    spec = session_spec(w, mode, **options, **extra, answer_tokens=args.answer_tokens, max_tokens=args.max_tokens,
                        call_timeout_ms=int(30000 + 4000 * longest_s))
    session = run_session(client, program, w, spec, timeout_s=30 + 4 * longest_s)
    run = Run(kind, scenario.id, scale, label, scenario.chains, session.trace,
              {t.call_id: 1000 * (t.finished_s - t.started_s) for t in session.timings if t.finished_s})
    planned = sum(map(len, w.plan))
    if session.exit_code != 0:
        run.error = session.error or f"exit code {session.exit_code}"
    elif not run.done:
        run.error = "no done event"
    elif run.done["calls"] != planned or run.done["tokens"] >= args.max_tokens:
        run.error = f"{run.done['calls']} of {planned} planned calls, {run.done['tokens']} tokens (--max-tokens)"
    return run


def warm_up(client, program) -> None:
    """A session that traps, so the first measured one pays for no compilation or first use."""
    scenario = load_scenarios("parallel", limit=1)[0]
    w, options = workload(scenario, 1.0, False)
    w.latency = lambda call: 3.0
    run_session(client, program, w, session_spec(w, "async", **options, answer_tokens=1, kv="auto"))


def measure(args) -> list[Run]:
    asynclm = library_program("asynclm")
    runs: list[Run] = []
    with embedded_server(args.model, default_state_dir()) as client:
        program = client.upload_file(asynclm.path, asynclm.name)
        t = time.perf_counter()
        warm_up(client, program)
        print(f"warm-up: {time.perf_counter() - t:.0f} s", flush=True)
        for kind in args.sets:
            for i, scenario in enumerate(load_scenarios(kind, limit=args.samples)):
                for j, scale in enumerate(args.latency_scale):
                    order = args.modes[(i + j) % len(args.modes):] + args.modes[:(i + j) % len(args.modes)]
                    for _ in range(args.reps):
                        for label in order:
                            run = run_one(client, program, scenario, kind, scale, label, args)
                            runs.append(run)
                            print(progress(run), flush=True)
    return runs


def progress(run: Run) -> str:
    head = f"{run.sample:>24} x{run.scale:<4g} {run.mode:<15}"
    if run.error:
        return f"{head} FAILED: {run.error}"
    d = run.done
    kv = ", ".join(f"{k} {v}" for k, v in sorted(d["decisions"].items())) or "-"
    return (f"{head} {run.wall_ms / 1000:7.1f} s  call phase {run.call_phase_ms() / 1000:6.1f} s  "
            f"calls {d['calls']} traps {d['traps']} kv {kv}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=3, help="samples per set (default %(default)s)")
    parser.add_argument("--sets", nargs="+", default=list(SETS), choices=SETS)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--latency-scale", nargs="+", type=float, default=[1.0, 16.0],
                        help="multipliers of the emulated execution times (default %(default)s)")
    parser.add_argument("--reps", type=int, default=1, help="sessions per mode and sample; the fastest is kept")
    parser.add_argument("--answer-tokens", type=int, default=8, help="free tokens after the calls")
    parser.add_argument("--max-tokens", type=int, default=2048,
                        help="the session's token budget, forced tokens included (a session that hits it fails)")
    parser.add_argument("--all-functions", action="store_true", help="describe every tool, not only the called")
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "asynclm.md")
    parser.add_argument("--raw", type=Path, help="also write every session's trace and timings here (JSON)")
    parser.add_argument("--reanalyse", type=Path, metavar="RAW", help="report on a --raw file instead of running")
    parser.add_argument("--plot", type=Path, metavar="CSV",
                        help="only draw the speedup plot (a png beside the CSV) from a speedup CSV of an earlier run")
    args = parser.parse_args()
    if args.plot:
        if not args.plot.is_file():
            parser.error(f"--plot: {args.plot} does not exist")
        message = plot_speedup(read_csv(args.plot), args.plot.with_suffix(".png"))
        print(message)
        return 0 if message.startswith("wrote") else 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.reanalyse:  # the run's own settings, machine and time, not this command's
        raw = json.loads(args.reanalyse.read_text())
        vars(args).update(raw["args"])
        runs = [Run(**r) for r in raw["runs"]]
    else:
        print("\n".join(machine_lines()), flush=True)
        raw = {"args": {k: v for k, v in vars(args).items() if k in SETTINGS}, "argv": sys.argv[1:],
               "machine": machine_lines(), "load": [os.getloadavg()[0]]}
        runs = measure(args)
        raw.update(load=raw["load"] + [os.getloadavg()[0]], measured=time.strftime("%Y-%m-%d %H:%M %Z"))
        if args.raw:
            args.raw.write_text(json.dumps({**raw, "runs": [dataclasses.asdict(r) for r in runs]}))
    sections = report(runs, [m for m in MODES if m in args.modes], args, raw)
    print("\n\n".join(sections))
    machine = "\n".join(f"- {line}" for line in raw["machine"])
    args.out.write_text(f"# AsyncLM: latency of every mode on BFCL\n\nMeasured {raw['measured']} on:\n\n"
                        f"{machine}\n\n" + "\n\n".join(sections) + "\n")
    print(f"\nwrote {args.out}")
    return 0

if __name__ == "__main__":
    sys.exit(main())
