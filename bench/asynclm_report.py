"""The report of ``bench/asynclm.py``: markdown sections, the speedup CSV and its plot."""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

from asynclm_runs import Run, Sample, groups, samples_of
from benchlib import markdown_table

PAPER_SPEEDUP = {"parallel": 1.6, "live_parallel": 1.6, "multi_step_parallel": 5.4}  # async over sync, local
IDEAL_GOAL = 1.10


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
            "`kv_page_ms_saved` (device pages × ms the inferlet itself freed while waiting: 0 under auto, where "
            "the server's interception policy places the KV), beside the page-ms of the waits "
            "(pages × wait, from the `kv` events) of the auto run and of the keep run. Same tokens: equal text "
            "events, over the pairs with the same schedule (calls, interrupts and traps in the same order); where "
            "timing moved a result or a trap, the two contexts differ and so may the tokens.\n\n"
            + markdown_table(["set", "scale", "samples", "page-ms saved, auto", "waits' page-ms, auto",
                              "waits' page-ms, keep",
                              "auto decisions", "latency auto / keep (s)", "same tokens", "other schedule"], rows))


def report(runs: list[Run], modes: list[str], args, raw: dict) -> list[str]:
    """The sections of the report on ``runs``, with a column per mode in ``modes``; writes the CSV and plot."""
    samples = samples_of(runs)
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
                f"{args.model} on one embedded server. Load average (1 min) at start {raw['load'][0]:.1f}, "
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
