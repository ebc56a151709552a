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
import csv
import dataclasses
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import RESULTS_DIR, machine_lines, markdown_table
from oven.control.asynclm import Workload, run_session, session_spec
from oven.control.commands import connected, resolve_program
from oven.control.inference_process import private_endpoint
from oven.control.tools import ToolRegistry, load_scenarios, parse_call
from oven.control.tools.registry import describe_line
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
PAPER_SPEEDUP = {"parallel": 1.6, "live_parallel": 1.6, "multi_step_parallel": 5.4}  # async over sync, local
IDEAL_GOAL = 1.10
SETTINGS = ("samples", "sets", "modes", "latency_scale", "reps", "answer_tokens", "max_tokens", "all_functions",
            "model")


@dataclass
class Run:
    set: str
    sample: str
    scale: float
    mode: str
    chains: list[list[str]]
    trace: list[dict] = field(default_factory=list)
    e_by_id: dict[str, float] = field(default_factory=dict)
    error: str = ""

    @property
    def done(self) -> dict:
        return next((e for e in reversed(self.trace) if e["type"] == "done"), {})

    @property
    def wall_ms(self) -> float:
        return self.done["wall_ms"]

    @property
    def calls(self) -> list[dict]:
        return [e for e in self.trace if e["type"] == "call"]

    def call_phase_ms(self) -> float:
        intrs = [e["t"] for e in self.trace if e["type"] == "intr"]
        return max(intrs) - self.calls[0]["t"]

    def g_by_id(self) -> dict[str, float]:
        """Generator time per call (see the module doc); the first call's holds the prompt prefill."""
        g, idle = {}, 0.0
        last = prev = self.done["t"] - self.wall_ms
        for i, e in enumerate(self.trace):
            if e["type"] == "trap":
                idle += e["t"] - prev
            elif e["type"] == "kv" and i + 1 < len(self.trace):
                idle += self.trace[i + 1]["t"] - e["t"]
            elif e["type"] == "call":
                g[e["id"]], last, idle = e["t"] - last - idle, e["t"], 0.0
            prev = e["t"]
        return g

    def wait_page_ms(self) -> float:
        """Device pages x ms of every wait, had the KV cache been kept through it."""
        return sum(e["pages"] * (after["t"] - e["t"]) for e, after in zip(self.trace, self.trace[1:])
                   if e["type"] == "kv")

    def schedule(self) -> tuple:
        """The order of calls, interrupts and traps: two runs with one schedule saw the same context."""
        events = [(e["type"], e.get("id")) for e in self.trace if e["type"] in ("call", "intr", "trap")]
        return self.done["traps"], events

    def text(self) -> str:
        return "".join(e["text"] for e in self.trace if e["type"] == "text")


# -- workloads and sessions ------------------------------------------------------------------

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


def run_one(client, program, scenario, kind, scale, label, args, cost_model) -> Run:
    mode, extra = MODES[label]
    w, options = workload(scenario, scale, args.all_functions)
    longest_s = max(w.latency(c) for chain in w.plan for c in chain)
    spec = session_spec(w, mode, **options, **extra, answer_tokens=args.answer_tokens, max_tokens=args.max_tokens,
                        cost_model=cost_model, call_timeout_ms=int(30000 + 4000 * longest_s))
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


def profile_trap_costs(client, program) -> dict | None:
    """A warm-up session that must trap, so the trap handler profiles its cost models once."""
    scenario = load_scenarios("parallel", limit=1)[0]
    w, options = workload(scenario, 1.0, False)
    w.latency = lambda call: 3.0
    session = run_session(client, program, w, session_spec(w, "async", **options, answer_tokens=1, kv="auto"))
    return next((e.get("cost_model") for e in session.trace if e["type"] == "done"), None)


def measure(args) -> tuple[list[Run], dict | None]:
    path, name = resolve_program("asynclm")
    runs: list[Run] = []
    with connected(private_endpoint(), args.model) as client:  # nothing serves a fresh endpoint: embedded
        program = client.upload_file(path, name)
        t = time.perf_counter()
        cost_model = profile_trap_costs(client, program)
        print(f"warm-up and trap-handler profile: {time.perf_counter() - t:.0f} s, cost model {cost_model}",
              flush=True)
        for kind in args.sets:
            for i, scenario in enumerate(load_scenarios(kind, limit=args.samples)):
                for j, scale in enumerate(args.latency_scale):
                    order = args.modes[(i + j) % len(args.modes):] + args.modes[:(i + j) % len(args.modes)]
                    for _ in range(args.reps):
                        for label in order:
                            run = run_one(client, program, scenario, kind, scale, label, args, cost_model)
                            runs.append(run)
                            print(progress(run), flush=True)
    return runs, cost_model


def progress(run: Run) -> str:
    head = f"{run.sample:>24} x{run.scale:<4g} {run.mode:<15}"
    if run.error:
        return f"{head} FAILED: {run.error}"
    d = run.done
    kv = ", ".join(f"{k} {v}" for k, v in sorted(d["decisions"].items())) or "-"
    return (f"{head} {run.wall_ms / 1000:7.1f} s  call phase {run.call_phase_ms() / 1000:6.1f} s  "
            f"calls {d['calls']} traps {d['traps']} kv {kv}")


# -- analysis --------------------------------------------------------------------------------

def ideal_call_phase_ms(run: Run) -> float | None:
    """LPT list scheduling over the chains from ``run``'s own G and E (see the module doc)."""
    slots, g_by_id = {}, run.g_by_id()
    for e in run.calls:  # which chain position each call event is, in the order written
        pos = next(((c, k) for c, chain in enumerate(run.chains) for k, call in enumerate(chain)
                    if (c, k) not in slots and call.strip() == e["call"].strip()), None)
        if pos is None or e["id"] not in run.e_by_id:
            return None
        slots[pos] = (g_by_id[e["id"]], run.e_by_id[e["id"]])
    if len(slots) != sum(map(len, run.chains)):
        return None
    first = next(iter(slots))  # dispatched at 0: its G (and the prefill) come before the call phase
    next_k = [int(c == first[0]) for c in range(len(run.chains))]
    ready_at = [slots[first][1] if c == first[0] else 0.0 for c in range(len(run.chains))]
    now, end = 0.0, slots[first][1]
    while pending := [c for c, chain in enumerate(run.chains) if next_k[c] < len(chain)]:
        ready = [c for c in pending if ready_at[c] <= now]
        if not ready:  # the generator idles until a result comes back
            now = min(ready_at[c] for c in pending)
            continue
        c = max(ready, key=lambda c: slots[(c, next_k[c])][1])  # longest execution first
        g, e = slots[(c, next_k[c])]
        now += g
        ready_at[c], next_k[c], end = now + e, next_k[c] + 1, max(end, now + e)
    return end


@dataclass
class Sample:
    """One sample at one latency scale: the fastest run of each mode, and what follows from them."""

    set: str
    name: str
    scale: float
    runs: dict[str, Run]

    def over_ideal(self) -> tuple[float, float] | None:
        """async ÷ ideal: (call phase, latency with the same prefix and answer as the run)."""
        a = self.runs.get("async")
        ideal = ideal_call_phase_ms(a) if a else None
        if not ideal:
            return None
        return a.call_phase_ms() / ideal, a.wall_ms / (a.wall_ms - a.call_phase_ms() + ideal)

    def theorem_61_excess(self) -> float | None:
        """async ÷ sync-parallel - 1 (latency); Theorem 6.1 says <= 0."""
        if "async" not in self.runs or "sync-parallel" not in self.runs:
            return None
        return self.runs["async"].wall_ms / self.runs["sync-parallel"].wall_ms - 1

    def speedup_point(self) -> dict | None:
        """E/G and the speedup of async over sync (Theorem 6.2), for the table and the CSV."""
        a, s = self.runs.get("async"), self.runs.get("sync")
        g = list(s.g_by_id().values())[1:] if s else []  # the first call's G holds the prefill
        if not a or not g or not a.e_by_id:
            return None
        e_ms, g_ms = statistics.mean(a.e_by_id.values()), statistics.mean(g)
        ideal = ideal_call_phase_ms(a)  # the model's sync call phase: every G after the first, every E
        model = (sum(list(a.g_by_id().values())[1:]) + sum(a.e_by_id.values())) / ideal if ideal else None
        return {"set": self.set, "sample": self.name, "scale": self.scale, "calls": len(a.calls),
                "e_ms": round(e_ms, 1), "g_ms": round(g_ms, 1), "e_over_g": round(e_ms / g_ms, 4),
                "speedup": round(s.wall_ms / a.wall_ms, 3),
                "speedup_call_phase": round(s.call_phase_ms() / a.call_phase_ms(), 3),
                "model_call_phase": round(model, 3) if model else None,
                "theorem_6_2": round(1 + e_ms / g_ms, 3)}


def samples_of(runs: list[Run]) -> list[Sample]:
    """Runs grouped by (set, sample, scale), keeping each mode's fastest rep (other load only adds)."""
    by_key: dict[tuple, Sample] = {}
    for run in runs:
        if not run.error:
            sample = by_key.setdefault((run.set, run.sample, run.scale), Sample(run.set, run.sample, run.scale, {}))
            if run.mode not in sample.runs or run.wall_ms < sample.runs[run.mode].wall_ms:
                sample.runs[run.mode] = run
    return list(by_key.values())


def groups(samples: list[Sample]) -> dict[tuple[str, float], list[Sample]]:
    out: dict[tuple[str, float], list[Sample]] = {}
    for s in samples:
        out.setdefault((s.set, s.scale), []).append(s)
    return out


def seconds(ms: float | None) -> str:
    return "—" if ms is None else f"{ms / 1000:.1f}"


def per_sample_section(samples: list[Sample], modes: list[str]) -> str:
    rows = []
    for s in samples:
        a, over, excess = s.runs.get("async"), s.over_ideal(), s.theorem_61_excess()
        rows.append([s.set, s.name, len(a.calls) if a else "—", f"{s.scale:g}",
                     *[seconds(s.runs[m].wall_ms) if m in s.runs else "—" for m in modes],
                     f"{over[0]:.2f} / {over[1]:.2f}" if over else "—",
                     "—" if excess is None else "ok" if excess <= 0 else f"**no** (+{excess:.0%})"])
    return ("## Latency per sample (s)\n\nLatency = the session's wall time (prompt prefill, calls, answer tokens). "
            "async ÷ ideal: its call phase (first call written → last result injected) over the LPT ideal "
            "from its own G and E, and its latency over the same with the ideal call phase.\n\n"
            + markdown_table(["set", "sample", "calls", "scale", *modes, "async ÷ ideal: call phase / latency",
                              "Thm 6.1: async ≤ sync-parallel"], rows))


def aggregate_section(samples: list[Sample], modes: list[str]) -> str:
    rows = []
    for (kind, scale), group in groups(samples).items():
        mean = {m: statistics.mean(s.runs[m].wall_ms for s in group) for m in modes
                if all(m in s.runs for s in group)}
        speedups = [f"{mean[m] / mean['async']:.2f}×" if "async" in mean and m in mean else "—"
                    for m in ("sync", "sync-stateless", "sync-parallel")]
        overs = [o for s in group if (o := s.over_ideal())]
        ideal = [f"{statistics.mean(o[i] for o in overs):.2f} / {max(o[i] for o in overs):.2f} "
                 f"({'met' if max(o[i] for o in overs) <= IDEAL_GOAL else '**missed**'})" if overs else "—"
                 for i in (0, 1)]
        rows.append([kind, f"{scale:g}", len(group), *[seconds(mean.get(m)) for m in modes], *speedups,
                     f"{PAPER_SPEEDUP[kind]}×", *ideal])
    return ("## Aggregated\n\nMean latency (s) over the samples; speedup = the baseline's mean latency ÷ async's. "
            f"Goal: async ≤ {IDEAL_GOAL:.2f} × ideal on every sample (mean / max over samples).\n\n"
            + markdown_table(["set", "scale", "samples", *modes, "async vs sync", "vs sync-stateless",
                              "vs sync-parallel", "paper, async vs sync", "async ÷ ideal, call phase",
                              "async ÷ ideal, latency"], rows))


def theorem_62_section(points: list[dict]) -> str:
    rows = []
    for kind, scale in dict.fromkeys((p["set"], p["scale"]) for p in points):
        group = [p for p in points if p["set"] == kind and p["scale"] == scale]
        avg = {k: statistics.mean(p[k] for p in group if p[k] is not None) if any(p[k] for p in group) else None
               for k in ("e_ms", "g_ms", "e_over_g", "speedup", "speedup_call_phase", "model_call_phase",
                         "theorem_6_2")}
        rows.append([kind, f"{scale:g}", f"{avg['e_ms']:.0f}", f"{avg['g_ms']:.0f}", f"{avg['e_over_g']:.3f}",
                     *[f"{avg[k]:.2f}×" if avg[k] else "—"
                       for k in ("speedup", "speedup_call_phase", "model_call_phase", "theorem_6_2")]])
    return ("## Speedup of async over sync against E/G (Theorem 6.2)\n\nE = mean executor time of the calls, "
            "G = mean generation time of the sync run's calls after the first; means over the samples. Model: "
            "the call phases of §6.3 from the async run's own G and E, (Σ G after the first + Σ E) ÷ ideal (LPT). "
            "The points per sample are in `asynclm_speedup.csv` and, where matplotlib is installed, plotted in "
            "`asynclm_speedup.png` (not committed).\n\n"
            + markdown_table(["set", "scale", "E ms", "G ms", "E/G", "sync ÷ async latency",
                              "sync ÷ async call phase", "model call phase", "1 + E/G"], rows))


def kv_section(samples: list[Sample]) -> str:
    rows = []
    for (kind, scale), group in groups(samples).items():
        pairs = [(s.runs["async"], s.runs["async-keep"]) for s in group if {"async", "async-keep"} <= s.runs.keys()]
        if not pairs:
            continue
        same = [(a, k) for a, k in pairs if a.schedule() == k.schedule()]
        decisions: dict[str, int] = {}
        for a, _ in pairs:
            for d, n in a.done["decisions"].items():
                decisions[d] = decisions.get(d, 0) + n
        rows.append([kind, f"{scale:g}", len(pairs), sum(a.done["kv_page_ms_saved"] for a, _ in pairs),
                     f"{sum(a.wait_page_ms() for a, _ in pairs):.0f}", f"{sum(k.wait_page_ms() for _, k in pairs):.0f}",
                     ", ".join(f"{d} {n}" for d, n in sorted(decisions.items())) or "no wait",
                     (f"{seconds(statistics.mean(a.wall_ms for a, _ in pairs))} / "
                      f"{seconds(statistics.mean(k.wall_ms for _, k in pairs))}"),
                     f"{sum(a.text() == k.text() for a, k in same)} of {len(same)}",
                     f"{len(pairs) - len(same)} of {len(pairs)}"])
    return ("## KV memory-time: trap handler (kv=auto) against always-keep\n\nSum over the samples of "
            "`kv_page_ms_saved` (device pages × ms not held while waiting), beside the page-ms of the waits "
            "(pages × wait, from the `kv` events) of the auto run and of the keep run. Same tokens: equal text "
            "events, over the pairs with the same schedule (calls, interrupts and traps in the same order); where "
            "timing moved a result or a trap, the two contexts differ and so may the tokens.\n\n"
            + markdown_table(["set", "scale", "samples", "page-ms saved, auto", "waits' page-ms, auto",
                              "waits' page-ms, keep",
                              "auto decisions", "latency auto / keep (s)", "same tokens", "other schedule"], rows))


def report(runs: list[Run], args, raw: dict) -> list[str]:
    samples = samples_of(runs)
    modes = [m for m in MODES if m in args.modes]
    violations = [f"{s.name} ×{s.scale:g}: async {s.runs['async'].wall_ms} ms > sync-parallel "
                  f"{s.runs['sync-parallel'].wall_ms} ms (+{excess:.0%})"
                  for s in samples if (excess := s.theorem_61_excess()) is not None and excess > 0]
    for line in violations:
        print(f"Theorem 6.1 violated: {line}")
    points = [p for s in samples if (p := s.speedup_point())]
    write_csv(points, args.out.with_name(args.out.stem + "_speedup.csv"))
    print(plot_speedup(points, args.out.with_name(args.out.stem + "_speedup.png")))
    failed = [f"- {r.sample} ×{r.scale:g} {r.mode}: {r.error}" for r in runs if r.error]
    settings = (f"Run: `bench/asynclm.py {' '.join(raw['argv'])}`: {args.samples} samples of {', '.join(args.sets)}; "
                f"latency scales {', '.join(f'{x:g}' for x in args.latency_scale)}; {args.reps} rep(s) per mode, "
                f"the fastest kept; {args.answer_tokens} answer tokens; "
                f"{'all functions' if args.all_functions else 'only the called functions'} in the prompt; "
                f"{args.model} on one embedded server. Trap-handler cost model, profiled once in a warm-up "
                f"session: `{raw['cost_model']}`. Load average (1 min) at start {raw['load'][0]:.1f}, "
                f"at end {raw['load'][1]:.1f}.")
    return [settings, per_sample_section(samples, modes), aggregate_section(samples, modes),
            theorem_62_section(points), kv_section(samples),
            "## Theorem 6.1 violations\n\n" + ("\n".join(f"- {v}" for v in violations) or "none"),
            *(["## Failed sessions\n\n" + "\n".join(failed)] if failed else [])]


def write_csv(rows: list[dict], path: Path) -> None:
    if rows:
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


def read_csv(path: Path) -> list[dict]:
    """The speedup points ``write_csv`` wrote, numbers as numbers."""
    with path.open(newline="") as f:
        return [{k: v if k in ("set", "sample") else (float(v) if v else None) for k, v in row.items()}
                for row in csv.DictReader(f)]


def plot_speedup(points: list[dict], path: Path) -> str:
    """Speedup of async over sync against E/G, beside Theorem 6.2's 1 + E/G, as a png; what was done."""
    try:
        import matplotlib
        matplotlib.use("Agg")  # no display: files only
        import matplotlib.pyplot as plt
    except ImportError:
        return f"no plot ({path.name}): matplotlib is not installed (.venv/bin/pip install -e '.[bench]')"
    if not points:
        return "no plot: no sample has both an async and a sync run"
    fig, ax = plt.subplots(figsize=(7, 4.8))
    for kind, marker in zip(dict.fromkeys(p["set"] for p in points), "os^Dv"):
        group = [p for p in points if p["set"] == kind]
        x = [p["e_over_g"] for p in group]
        line = ax.scatter(x, [p["speedup"] for p in group], marker=marker, label=f"{kind}: latency")
        ax.scatter(x, [p["speedup_call_phase"] for p in group], marker=marker, facecolors="none",
                   edgecolors=line.get_facecolor(), label=f"{kind}: call phase")
    modelled = [p for p in points if p["model_call_phase"] is not None]
    ax.scatter([p["e_over_g"] for p in modelled], [p["model_call_phase"] for p in modelled], marker="x",
               color="black", s=16, linewidths=0.8, label="§6.3 model of the call phase (run's own G, E)")
    top = max(p["e_over_g"] for p in points) * 1.1
    ax.plot([0, top], [1, 1 + top], color="black", linewidth=1, label="Theorem 6.2: 1 + E/G (many calls)")
    ax.axhline(1, color="grey", linewidth=0.5, linestyle=":")
    ax.set_xlabel("E/G (mean execution time of a call / mean generation time of a call)")
    ax.set_ylabel("speedup, sync ÷ async")
    ax.set_title("AsyncLM on BFCL: speedup of async over sync")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"wrote {path}"


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
        runs, raw["cost_model"] = measure(args)
        raw.update(load=raw["load"] + [os.getloadavg()[0]], measured=time.strftime("%Y-%m-%d %H:%M %Z"))
        if args.raw:
            args.raw.write_text(json.dumps({**raw, "runs": [dataclasses.asdict(r) for r in runs]}))
    sections = report(runs, args, raw)
    print("\n\n".join(sections))
    machine = "\n".join(f"- {line}" for line in raw["machine"])
    args.out.write_text(f"# AsyncLM: latency of every mode on BFCL\n\nMeasured {raw['measured']} on:\n\n"
                        f"{machine}\n\n" + "\n\n".join(sections) + "\n")
    print(f"\nwrote {args.out}")
    return 0

if __name__ == "__main__":
    sys.exit(main())
