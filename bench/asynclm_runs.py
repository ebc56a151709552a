"""What one AsyncLM benchmark session measured (:class:`Run`), and what follows from a sample's runs
(:class:`Sample`): G and E per call, the LPT ideal, Theorem 6.1's check and 6.2's point.
``bench/asynclm.py``'s docstring defines every quantity."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field


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
