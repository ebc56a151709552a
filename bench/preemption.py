"""Pool pressure: many concurrent completions on a KvPage pool too small for all, under every exhaustion policy.

N instances of the ``text-completion`` inferlet (Python SDK, greedy, T new tokens, chat prompts that
differ per instance) are launched at once on a real inference process serving SmolLM2 (its default
pool: 512 MiB of KV on the CPU, and a host tier as large) and a fresh ControlLoop per policy, all
policies one after the other in one run: ``terminate-newest``, ``wait``, ``offload`` and ``preempt``
(the default). Per policy: instances finished / killed / failed, wall time, tokens per second of the
finished ones, mean items per batch, instances preempted (swapped out for an older one), and whether
every finished instance's tokens equal those of the same instance under ``preempt`` (greedy decoding:
a policy changes cost, never results). Goal: under ``preempt`` all N finish.

Run: ``.venv/bin/python bench/preemption.py`` (512 x 32 on the default pool: the issue's figure);
``--instances 96 --num-kv-pages 96`` is the same pressure at a size a loaded 2-core machine runs in
minutes.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import doc_parser, machine_lines, markdown_table, write_results  # noqa: E402

from oven.client.paths import inferlets_dir  # noqa: E402
from oven.control.config import ControlConfig, default_program_dir  # noqa: E402
from oven.control.inference_process import start_inference_process  # noqa: E402
from oven.control.resources.exhaustion import OFFLOAD, PREEMPT, TERMINATE_NEWEST, WAIT  # noqa: E402
from oven.control.runtime.instance import State  # noqa: E402
from oven.control.runtime.loop import ControlLoop  # noqa: E402
from oven.control.serve import settle_heap  # noqa: E402
from oven.inference.config import DEFAULT_MODEL, InferenceConfig  # noqa: E402
from oven.proto.endpoints import private_endpoint  # noqa: E402

POLICIES = (TERMINATE_NEWEST, WAIT, OFFLOAD, PREEMPT)
PROGRAM = "text-completion"
TOPICS = ("a paged KV cache", "a lighthouse keeper", "the first snow", "a lost robot", "a city at night",
          "an old map", "a quiet library", "the tide")


def parse_args() -> argparse.Namespace:
    parser = doc_parser(__doc__)
    add = parser.add_argument
    add("--instances", type=int, default=512, help="instances launched at once (default %(default)s)")
    add("--tokens", type=int, default=32, help="new tokens per instance (default %(default)s)")
    add("--policies", nargs="+", default=list(POLICIES), choices=POLICIES, help="policies to run (default: all)")
    add("--num-kv-pages", type=int, default=None, help="device KvPage pool (default: the model's default pool)")
    add("--num-host-pages", type=int, default=None, help="host tier slots (default: as many as the device pool)")
    add("--model", default=DEFAULT_MODEL, help="served model (default %(default)s)")
    add("--timeout-s", type=float, default=1800, help="a policy's run is cut off after this long (default %(default)s)")
    add("--program-dir", default=str(Path(default_program_dir()).parent / "bench-programs"),
        help="program store with its compiled-code cache (default %(default)s)")
    return parser.parse_args()


@dataclass
class Outcome:
    policy: str
    finished: int
    killed: int
    failed: int
    cut_off: int
    wall_s: float
    tokens: int
    mean_batch_items: float
    preempted: int
    outputs: dict[int, str]  # instance index -> the token ids it sent
    first_error: str


def run_policy(server, args, policy: str) -> Outcome:
    messages: dict[str, str] = {}

    def on_event(inst, kind: str, payload) -> None:
        if kind == "message":
            messages[inst.instance_id] = payload
    config = ControlConfig(program_dir=args.program_dir, exhaustion_policy=policy, instance_memory_mib=256,
                           max_instances=max(1024, args.instances), max_instances_per_client=args.instances)
    loop = ControlLoop(server.client(), config, on_event)
    loop.programs.add((inferlets_dir() / PROGRAM / f"{PROGRAM}.wasm").read_bytes(), PROGRAM)
    start = time.perf_counter()
    runs = [loop.launch(PROGRAM, [f"Write a short story about {TOPICS[i % len(TOPICS)]}, part {i}.",
                                  str(args.tokens), "--chat"]) for i in range(args.instances)]
    loop.run_until(lambda: not any(r.alive for r in runs), args.timeout_s)
    wall_s = time.perf_counter() - start
    stats = loop.replicas[0].scheduler.stats()
    outputs = {i: messages[r.instance_id] for i, r in enumerate(runs)
               if r.state is State.FINISHED and r.instance_id in messages}
    errors = [r.error for r in runs if r.error]
    outcome = Outcome(policy, sum(r.state is State.FINISHED for r in runs), sum(r.state is State.KILLED for r in runs),
                      sum(r.state is State.FAILED for r in runs), sum(r.alive for r in runs), wall_s,
                      sum(len(text.split()) for text in outputs.values()),
                      stats.num_commands / max(1, stats.num_batches), loop.replicas[0].allocator.num_preempted, outputs,
                      errors[0] if errors else "")
    loop.close()
    return outcome


def main() -> None:
    args = parse_args()
    settle_heap()
    cfg = InferenceConfig(model=args.model, endpoint=private_endpoint(), num_kv_pages=args.num_kv_pages,
                          num_host_pages=args.num_host_pages)
    print("\n".join(machine_lines()), flush=True)
    with start_inference_process(cfg) as server:
        info = server.info
        print(f"{info.model_name}: {info.num_kv_pages} KvPages of {info.page_size}, {info.num_host_pages} host slots; "
              f"{args.instances} x {PROGRAM} x {args.tokens} tokens", flush=True)
        outcomes = []
        for policy in args.policies:
            outcome = run_policy(server, args, policy)
            print(f"{policy}: {outcome.finished} finished, {outcome.killed} killed, {outcome.failed} failed, "
                  f"{outcome.cut_off} cut off in {outcome.wall_s:.0f} s; {outcome.preempted} preempted", flush=True)
            outcomes.append(outcome)
    reference = next((o.outputs for o in outcomes if o.policy == PREEMPT), outcomes[0].outputs)
    rows = []
    for o in outcomes:
        same = sum(reference.get(i) == text for i, text in o.outputs.items())
        rows.append([o.policy, f"{o.finished}/{args.instances}", o.killed, o.failed, o.cut_off, f"{o.wall_s:.0f}",
                     f"{o.tokens / o.wall_s:.1f}", f"{o.mean_batch_items:.1f}", o.preempted,
                     f"{same}/{len(o.outputs)}", o.first_error[:80]])
    table = markdown_table(["policy", "finished", "killed", "failed", "cut off", "wall s", "tokens/s", "items/batch",
                            "preempted", "same tokens as preempt", "first error"], rows)
    print(table)
    command = " ".join(["python bench/preemption.py", *sys.argv[1:]])
    path = write_results(f"preemption_{args.instances}x{args.tokens}",
                         "Pool pressure: exhaustion policies side by side",
                         [f"{info.model_name}, {info.num_kv_pages} KvPages of {info.page_size} tokens, "
                          f"{info.num_host_pages} host slots; {args.instances} concurrent `{PROGRAM}` x {args.tokens} "
                          f"tokens (greedy, chat prompts). Command: `{command}`", table])
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
