"""InferCept's workload: agent requests that pause for tools, under every interception policy side by side.

Requests of the ``tool-agent`` inferlet (Python SDK, greedy) arrive at a fixed rate (Poisson, seeded)
on one fresh ``oven serve`` per interception policy (``--interception-policy infercept | preserve |
discard | swap``), each with a KvPage pool too small to hold every paused context. A request decodes
``--tokens`` tokens, waits for a tool (a real timer: the server sees the instance intercepted, and the
inferlet announces the wait with a pause hint of its length), appends the tool's result, and repeats;
its augmentation (one of the six of the InferCept blog) sets how often it pauses and for how long,
drawn per request with the seed; ``--time-scale`` scales every wait. The same requests, arrival times
and waits go to every policy.

Per policy, from the client's clock: completed requests per minute (completed / first arrival to last
completion) and p50 / p90 latency (arrival to exit); from the server's own stats (``oven stats``):
the share of device time spent recomputing discarded K/V (the batches' send-to-reply seconds, split by
tokens, of the forwards that ask for no distribution: only the SDK's recompute sends those, so the
figure is 0 wherever nothing was discarded), device pages of intercepted instances integrated over
time (page-seconds), in all ("paused") and while memory was short (instances waited for pages, or
under 10% of the pool was free): the memory *idle* while others waited; the pages of the batches that
recomputed discarded K/V times their recompute seconds (memory held while the recompute lengthened
their steps); the pages of the contexts not intercepted times the seconds of the batches that copied
pages to or from the host (a copy runs between two steps: on a CPU the copy itself, on CUDA only its
launch); their sum, InferCept's *waste*; swaps, discards and preemptions, and the cost profile it learnt.
Every request's tokens must be the same under every policy (greedy): the policy changes cost, never
results.

``--rates`` takes several arrival rates: the same requests (only their arrival times scale) then run
under every policy at every rate, and the bench compares what InferCept compares, completed requests
per minute *at the same p90 latency*: per policy, the most requests per minute among its rates whose
runs completed every request within a p90 target (``--p90-target``; default the p90 of ``discard`` at
the lowest rate, the latency discarding costs even when lightly loaded).

Run: ``.venv/bin/python bench/infercept.py`` (about 8 minutes on 2 loaded cores); the sweep
``--rates 40 60 90 135`` takes about four times as long.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import doc_parser, machine_lines, markdown_table, percentile, write_results  # noqa: E402
from served import Server, wasm  # noqa: E402

from oven.control.config import default_program_dir  # noqa: E402
from oven.control.scheduling.interception import NAMES  # noqa: E402
from oven.inference.config import DEFAULT_MODEL  # noqa: E402
from oven.proto import control as c  # noqa: E402

PROGRAM = "tool-agent"
# The six augmentations of the InferCept blog: (pauses per request, seconds per pause), each drawn
# uniformly from its range. The blog gives 3 to 28 interceptions per request, calculator calls under
# 1 s and model-backed tools (text-to-speech, stable diffusion) about 20x longer; a chatbot's wait is
# its user writing a follow-up.
AUGMENTATIONS = {
    "calculator": ((3, 5), (0.05, 0.9)),
    "wikipedia": ((3, 6), (0.5, 2.0)),
    "virtual-env": ((20, 28), (0.1, 1.0)),
    "chatbot": ((3, 6), (5.0, 30.0)),
    "image": ((3, 4), (5.0, 20.0)),
    "tts": ((3, 6), (5.0, 20.0)),
}


@dataclass(frozen=True)
class Request:
    index: int
    arrival_s: float  # after the run's start
    augmentation: str
    pauses_ms: tuple[int, ...]

    def args(self, tokens: int) -> list[str]:
        prompt = f"You are agent {self.index}. Use the {self.augmentation} tool to solve task {self.index}."
        return [prompt, "--tokens", str(tokens), "--pauses", ",".join(map(str, self.pauses_ms)),
                "--tool", self.augmentation]


def workload(num: int, rate_per_min: float, time_scale: float, seed: int) -> list[Request]:
    rng, arrival, requests = random.Random(seed), 0.0, []
    for i in range(num):
        kind = rng.choice(sorted(AUGMENTATIONS))
        (lo, hi), (short_s, long_s) = AUGMENTATIONS[kind]
        pauses = tuple(max(1, round(rng.uniform(short_s, long_s) * time_scale * 1000))
                       for _ in range(rng.randint(lo, hi)))
        requests.append(Request(i, arrival, kind, pauses))
        arrival += rng.expovariate(rate_per_min / 60)
    return requests


@dataclass
class Outcome:
    policy: str
    rate: float = 0.0  # mean arrivals per minute
    latency_s: dict[int, float] = field(default_factory=dict)  # request -> arrival to exit, completed ones
    outputs: dict[int, str] = field(default_factory=dict)  # request -> its token ids
    errors: dict[int, str] = field(default_factory=dict)
    span_s: float = 0.0  # first arrival to last completion
    stats: c.StatsReply | None = None
    profile: str = ""

    @property
    def per_min(self) -> float:
        return 60 * len(self.latency_s) / self.span_s if self.span_s else 0.0


def parse_args() -> argparse.Namespace:
    parser = doc_parser(__doc__)
    add = parser.add_argument
    add("--requests", type=int, default=24, help="requests per policy (default %(default)s)")
    add("--rates", type=float, nargs="+", default=[40],
        help="mean arrivals per minute, Poisson; several make a sweep (default %(default)s)")
    add("--p90-target", type=float, default=None,
        help="p90 latency target of the sweep, seconds (default: discard's p90 at the lowest rate)")
    add("--time-scale", type=float, default=0.1, help="multiplies every tool's wait (default %(default)s)")
    add("--tokens", type=int, default=8, help="tokens decoded between two pauses (default %(default)s)")
    add("--num-kv-pages", type=int, default=48, help="device KvPage pool (default %(default)s)")
    add("--num-host-pages", type=int, default=1024,
        help="host tier slots (default %(default)s: room for every context, as InferCept assumes)")
    add("--torch-threads", type=int, default=1, help="the inference process's threads (default %(default)s)")
    add("--policies", nargs="+", default=list(NAMES), choices=NAMES, help="interception policies (default: all)")
    add("--seed", type=int, default=0, help="draws the requests, their waits and arrivals (default %(default)s)")
    add("--model", default=DEFAULT_MODEL, help="served model (default %(default)s)")
    add("--timeout-s", type=float, default=300, help="a policy's run is cut off after this long (default %(default)s)")
    add("--program-dir", default=str(Path(default_program_dir()).parent / "bench-programs"),
        help="program store with its compiled-code cache, shared by the servers (default %(default)s)")
    return parser.parse_args()


def run_policy(args, policy: str, requests: list[Request], root: Path) -> Outcome:
    root.mkdir(parents=True, exist_ok=True)
    log = root / f"serve-{policy}.log"
    srv = Server(root / policy, args.model, "--interception-policy", policy, "--num-kv-pages", str(args.num_kv_pages),
                 "--num-host-pages", str(args.num_host_pages), "--torch-threads", str(args.torch_threads),
                 "--program-dir", args.program_dir, "--max-instances-per-client", str(len(requests)), log=log)
    outcome = Outcome(policy)
    try:
        with srv.client() as client:
            client.upload(wasm(PROGRAM), PROGRAM)
            drive(client, requests, args, outcome)
            outcome.stats = client.stats()
    finally:
        srv.stop()
    outcome.profile = outcome.stats.profile.describe() if outcome.stats and outcome.stats.profile else "(none)"
    return outcome


def drive(client, requests: list[Request], args, outcome: Outcome) -> None:
    """Launch each request at its arrival time and collect exits until all are done or time runs out."""
    pending, by_id, start = list(requests), {}, time.monotonic()
    last_exit = start
    for event in client.events(poll_s=0.02):
        now = time.monotonic() - start
        while pending and pending[0].arrival_s <= now:
            request = pending.pop(0)
            by_id[client.launch(PROGRAM, request.args(args.tokens))] = request
        if event is not None and event.instance_id in by_id:
            request = by_id[event.instance_id]
            if event.kind == "message":
                outcome.outputs[request.index] = event.text
            elif event.kind == "exit":
                if event.exit_code == 0 and request.index in outcome.outputs:
                    outcome.latency_s[request.index] = now - request.arrival_s
                    last_exit = time.monotonic()
                else:
                    outcome.errors[request.index] = f"exit {event.exit_code}: {event.text}"
        if not pending and len(outcome.latency_s) + len(outcome.errors) == len(requests):
            break
        if now > args.timeout_s:
            break
    outcome.span_s = last_exit - start - requests[0].arrival_s


def references(outcomes: list[Outcome]) -> dict[int, str]:
    """Each request's tokens under ``preserve`` (nothing recomputed or copied), else under the first
    policy that completed it."""
    ordered = sorted(outcomes, key=lambda o: o.policy != "preserve")
    return {i: text for o in reversed(ordered) for i, text in o.outputs.items() if i in o.latency_s}


def differing(o: Outcome, reference: dict[int, str]) -> list[int]:
    return [i for i in o.latency_s if o.outputs[i] != reference[i]]


def report_rows(outcomes: list[Outcome], reference: dict[int, str], num_requests: int) -> list[list[object]]:
    rows = []
    for o in outcomes:
        s, latencies = o.stats, sorted(o.latency_s.values())
        same = len(o.latency_s) - len(differing(o, reference))
        rows.append([o.policy, f"{len(o.latency_s)}/{num_requests}", f"{o.per_min:.1f}",
                     f"{percentile(latencies, 50):.1f}", f"{percentile(latencies, 90):.1f}",
                     f"{s.device_s:.0f}", f"{100 * s.rewrite_s / max(s.device_s, 1e-9):.1f}%",
                     f"{s.intercepted_page_s:.0f}", f"{s.contended_page_s:.0f}", f"{s.rewrite_page_s:.0f}",
                     f"{s.copy_page_s:.0f}", f"{waste(s):.0f}", s.num_swapped_out, s.num_swapped_in,
                     s.num_discarded, s.num_preempted, f"{same}/{len(o.latency_s)}"])
    return rows


HEADERS = ["policy", "completed", "requests/min", "p50 s", "p90 s", "device s", "recompute share",
           "paused page-s", "idle page-s", "recompute page-s", "copy page-s",
           "waste page-s", "swapped out", "swapped in ahead", "discarded", "preempted", "same tokens"]


def waste(s: c.StatsReply) -> float:
    """InferCept's memory waste, page-seconds: paused pages while memory was short, the pages of the
    batches that recomputed for as long as the recompute took, and the running contexts' pages for as
    long as copies to and from the host held their next step up."""
    return s.contended_page_s + s.rewrite_page_s + s.copy_page_s


def ratio_lines(outcomes: list[Outcome]) -> list[str]:
    """infercept against each other policy: requests per minute, p90 latency and memory waste."""
    ic = next((o for o in outcomes if o.policy == "infercept"), None)
    if ic is None:
        return []

    def ratio(a: float, b: float) -> str:
        return f"{a / b:.2f}x" if b else "-"
    p90 = {o.policy: percentile(sorted(o.latency_s.values()), 90) for o in outcomes}
    return [f"infercept / {o.policy}: requests/min {ratio(ic.per_min, o.per_min)}, "
            f"p90 {ratio(p90[ic.policy], p90[o.policy])}, "
            f"waste {ratio(waste(ic.stats), waste(o.stats))}"
            for o in outcomes if o is not ic]


def p90(o: Outcome) -> float:
    """The run's p90 latency, seconds (nan when it completed nothing)."""
    return percentile(sorted(o.latency_s.values()), 90) if o.latency_s else float("nan")


def best_within(runs: dict[float, list[Outcome]], target_s: float, num_requests: int) -> dict[str, Outcome]:
    """Per policy, its run with the most requests per minute among those that completed every request
    with a p90 latency within ``target_s``; a policy with no such run is left out."""
    best: dict[str, Outcome] = {}
    for outcomes in runs.values():
        for o in outcomes:
            if len(o.latency_s) == num_requests and p90(o) <= target_s and \
                    (o.policy not in best or o.per_min > best[o.policy].per_min):
                best[o.policy] = o
    return best


def sweep_sections(runs: dict[float, list[Outcome]], target_s: float, num_requests: int) -> list[str]:
    """The rate sweep: requests per minute and p90 of every policy at every rate, and each policy's
    best within the p90 target with infercept's ratio to it."""
    policies = [o.policy for o in next(iter(runs.values()))]
    rows = [[policy, *(next(f"{o.per_min:.1f} / {p90(o):.1f}" + ("" if len(o.latency_s) == num_requests else
                                                              f" ({len(o.latency_s)}/{num_requests})")
                            for o in outcomes if o.policy == policy) for outcomes in runs.values())]
            for policy in policies]
    table = markdown_table(["policy", *(f"{rate:g}/min" for rate in runs)], rows)
    best = best_within(runs, target_s, num_requests)
    lines = [f"- `{policy}`: " + (f"{best[policy].per_min:.1f} requests/min (at {best[policy].rate:g}/min, p90 "
                                  f"{p90(best[policy]):.1f} s)" if policy in best else "no run within the target")
             for policy in policies]
    if "infercept" in best:
        ic = best["infercept"].per_min
        lines += [f"- infercept / {policy}: {ic / best[policy].per_min:.2f}x" for policy in policies
                  if policy != "infercept" and policy in best]
    return [f"Rate sweep: requests/min / p90 s per policy and arrival rate\n\n{table}",
            f"Requests per minute at the same p90 latency (every request completed, p90 <= {target_s:.1f} s):\n\n"
            + "\n".join(lines)]


def main() -> None:
    args = parse_args()
    rates = sorted(args.rates)
    print("\n".join(machine_lines()), flush=True)
    runs: dict[float, list[Outcome]] = {}
    with tempfile.TemporaryDirectory(prefix="oven-infercept-") as tmp:
        for rate in rates:
            requests = workload(args.requests, rate, args.time_scale, args.seed)
            kinds = {k: sum(r.augmentation == k for r in requests) for k in sorted(AUGMENTATIONS)}
            num_pauses = [len(r.pauses_ms) for r in requests]
            print(f"{args.requests} requests at {rate:g}/min over {requests[-1].arrival_s:.0f} s, {kinds}; "
                  f"{sum(num_pauses)} pauses ({min(num_pauses)}-{max(num_pauses)} per request), "
                  f"waits {min(min(r.pauses_ms) for r in requests)}-{max(max(r.pauses_ms) for r in requests)} ms; "
                  f"{args.num_kv_pages} KvPages, {args.num_host_pages} host slots", flush=True)
            runs[rate] = []
            for policy in args.policies:
                o = run_policy(args, policy, requests, Path(tmp) / f"{rate:g}")
                o.rate = rate
                print(f"{policy} at {rate:g}/min: {len(o.latency_s)} completed, {len(o.errors)} failed in "
                      f"{o.span_s:.0f} s, p90 {p90(o):.1f} s; {o.profile}", flush=True)
                for index, error in list(o.errors.items())[:3]:
                    print(f"  request {index}: {error[:160]}", flush=True)
                runs[rate].append(o)
    # Only arrival times differ between rates, so one reference serves every run.
    reference = references([o for outcomes in runs.values() for o in outcomes])
    sections = []
    for rate, outcomes in runs.items():
        for o in outcomes:
            for i in differing(o, reference)[:3]:
                mine, theirs = o.outputs[i].split(), reference[i].split()
                at = next((k for k, (a, b) in enumerate(zip(mine, theirs)) if a != b), min(len(mine), len(theirs)))
                print(f"  {o.policy} at {rate:g}/min: request {i} ({requests[i].augmentation}) differs from token "
                      f"{at} of {len(theirs)}")
        table = markdown_table(HEADERS, report_rows(outcomes, reference, len(requests)))
        ratios = ratio_lines(outcomes)
        profiles = [f"- `{o.policy}`: {o.profile}" for o in outcomes]
        failures = [f"- `{o.policy}`: request {i} ({requests[i].augmentation}, {len(requests[i].pauses_ms)} pauses): "
                    f"{error}" for o in outcomes for i, error in sorted(o.errors.items())] or ["- none"]
        print(f"at {rate:g}/min:", table, *ratios, *profiles, sep="\n")
        sections += [f"## {rate:g} requests/min\n\n{table}", "\n".join(f"- {line}" for line in ratios),
                     "Requests that failed:\n\n" + "\n".join(failures),
                     "Cost profiles (the server's stats at the end of the run):\n\n" + "\n".join(profiles)]
    if len(runs) > 1:
        first = next((o for o in runs[rates[0]] if o.policy == "discard"), None)
        target_s = args.p90_target or (p90(first) if first and first.latency_s else max(
            (p90(o) for o in runs[rates[0]] if o.latency_s), default=float("inf")))
        sweep = sweep_sections(runs, target_s, len(requests))
        print(*sweep, sep="\n\n")
        sections = sweep + sections
    num_pauses = sum(len(r.pauses_ms) for r in requests)
    command = " ".join(["python bench/infercept.py", *sys.argv[1:]])
    name = "infercept" if len(runs) == 1 else "infercept_sweep"
    path = write_results(name, "InferCept's workload: interception policies side by side",
                         [f"{args.model}, {args.requests} `{PROGRAM}` requests at {', '.join(f'{r:g}' for r in rates)}"
                          f"/min (Poisson, seed {args.seed}), {num_pauses} tool waits, time scale {args.time_scale}, "
                          f"{args.tokens} tokens per step, {args.num_kv_pages} KvPages and {args.num_host_pages} host "
                          f"slots, {args.torch_threads} torch thread(s). Command: `{command}`", *sections])
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
