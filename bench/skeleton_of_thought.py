"""Skeleton-of-thought: the points of one skeleton expanded side by side against one after another.

The ``skeleton-of-thought`` inferlet (inferlets/skeleton-of-thought) on a real inference process
serving SmolLM2-135M-Instruct on this machine. A first run writes the skeleton (and compiles and warms
everything up); then, round by round, the same points are expanded in parallel (a fork per point,
their decode steps batched) and with ``--sequential`` (one context, rewound to the shared question and
skeleton after each point), one instance at a time. Both must give the same tokens, point for point.
Measures the expansion's wall time inside the inferlet and the instance's launch-to-exit time.

    .venv/bin/python bench/skeleton_of_thought.py [--points 4] [--max-tokens 32] [--rounds 3]
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import doc_parser, markdown_table, publish  # noqa: E402
from library_loop import library_loop  # noqa: E402

QUESTION = "How can I improve my sleep?"
MODES = {"sequential": ["--sequential"], "parallel": []}


def parse_args():
    parser = doc_parser(__doc__)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--points", type=int, default=4, help="the skeleton's points at most")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens per point's expansion at most")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the inference process")
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    with library_loop("skeleton-of-thought", args.model, args.threads) as runner:
        def run(flags: list[str]) -> tuple[float, dict]:
            return runner.run([QUESTION, "--max-tokens", str(args.max_tokens), *flags], timeout_s=600)

        _, first = run(["--points", str(args.points)])  # writes the skeleton; compiles and warms up
        skeleton = first["skeleton"]
        wall: dict[str, list[float]] = {mode: [] for mode in MODES}
        expand: dict[str, list[float]] = {mode: [] for mode in MODES}
        tokens = {}
        for r in range(args.rounds):
            for mode, flags in MODES.items():
                took, report = run(["--skeleton", "|".join(skeleton), *flags])
                wall[mode].append(took)
                expand[mode].append(report["expand_ms"] / 1e3)
                tokens[mode] = [e["tokens"] for e in report["expansions"]]
            if tokens["parallel"] != tokens["sequential"]:
                raise RuntimeError(f"round {r + 1}: the parallel expansion differs from the sequential one")
            print(f"round {r + 1}: expansion sequential {expand['sequential'][-1]:.2f} s, "
                  f"parallel {expand['parallel'][-1]:.2f} s", flush=True)

    med = {mode: (statistics.median(expand[mode]), statistics.median(wall[mode])) for mode in MODES}
    rows = [[mode, f"{med[mode][0]:.2f}", f"{min(expand[mode]):.2f}", f"{max(expand[mode]):.2f}",
             f"{med[mode][1]:.2f}"] for mode in MODES]
    table = markdown_table(["expansion", "median s", "min", "max", "launch to exit median s"], rows)
    num_tokens = sum(map(len, tokens["parallel"]))
    summary = (f"{len(skeleton)} points ({num_tokens} tokens expanded, the same in both), {args.model}, "
               f"{args.threads} torch thread(s), {args.rounds} rounds: expansion time sequential / parallel = "
               f"**{med['sequential'][0] / med['parallel'][0]:.2f}x**; launch to exit "
               f"**{med['sequential'][1] / med['parallel'][1]:.2f}x**.\n\nSkeleton: "
               + "; ".join(f"{i}. {p}" for i, p in enumerate(skeleton, 1)))
    publish("skeleton_of_thought", "Skeleton-of-thought: parallel against sequential expansion", [table, summary])
    return 0


if __name__ == "__main__":
    sys.exit(main())
