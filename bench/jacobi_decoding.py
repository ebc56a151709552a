"""Jacobi decoding against plain greedy decoding: forwards and wall time, side by side.

The ``jacobi-decoding`` inferlet (inferlets/jacobi-decoding) on a real inference process serving
SmolLM2-135M-Instruct on this CPU, one instance at a time: per prompt, ``--window 0`` (plain greedy
decoding, one forward a token, pipelined) and ``--window N`` (Jacobi rounds of N guesses) alternate
round by round; their tokens must be equal. Reported: forwards per run, launch-to-exit time
(median), and the ratios plain / Jacobi (above 1: Jacobi better).

    .venv/bin/python bench/jacobi_decoding.py [--window 4] [--max-new-tokens 48] [--rounds 3]
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import doc_parser, markdown_table, publish  # noqa: E402
from library_loop import library_loop  # noqa: E402

# Prompts whose continuations repeat a pattern (counting, code, a listing): where Jacobi guesses converge.
PROMPTS = ["Count from 1 to 40: 1, 2, 3, 4, 5,",
           "def fibonacci(n):\n    if n <= 1:\n        return n\n    return",
           "The alphabet: A B C D E F G"]


def parse_args():
    parser = doc_parser(__doc__)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--window", type=int, default=4, help="Jacobi guesses a round")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the inference process")
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    cases = {"greedy": "0", "jacobi": str(args.window)}
    times = {(p, c): [] for p in PROMPTS for c in cases}
    forwards, tokens = {}, {}
    with library_loop("jacobi-decoding", args.model, args.threads) as runner:
        runner.run([PROMPTS[0], "4"])  # compiles the component and warms the process up
        for r in range(args.rounds):
            for prompt in PROMPTS:
                for case, window in cases.items():
                    took, report = runner.run([prompt, str(args.max_new_tokens), "--window", window])
                    times[prompt, case].append(took)
                    forwards[prompt, case], tokens[prompt, case] = report["forward_calls"], report["tokens"]
                if tokens[prompt, "greedy"] != tokens[prompt, "jacobi"]:
                    raise RuntimeError(f"Jacobi's tokens differ from greedy's for {prompt!r}")
            print(f"round {r + 1} done", flush=True)

    med = {key: statistics.median(values) * 1e3 for key, values in times.items()}
    rows = []
    for prompt in PROMPTS:
        g, j = (prompt, "greedy"), (prompt, "jacobi")
        rows.append([repr(prompt[:28]), len(tokens[g]), forwards[g], forwards[j], f"{forwards[g] / forwards[j]:.2f}x",
                     f"{med[g]:.0f}", f"{med[j]:.0f}", f"{med[g] / med[j]:.2f}x"])
    total_g, total_j = (sum(forwards[p, c] for p in PROMPTS) for c in cases)
    time_g, time_j = (sum(med[p, c] for p in PROMPTS) for c in cases)
    rows.append(["all", sum(len(tokens[p, "greedy"]) for p in PROMPTS), total_g, total_j, f"{total_g / total_j:.2f}x",
                 f"{time_g:.0f}", f"{time_j:.0f}", f"{time_g / time_j:.2f}x"])
    table = markdown_table(["prompt", "tokens", "forwards greedy", "forwards Jacobi", "forwards greedy / Jacobi",
                            "ms greedy", "ms Jacobi", "time greedy / Jacobi"], rows)
    summary = (f"{args.model}, window {args.window}, {args.max_new_tokens} new tokens, {args.threads} torch thread(s), "
               f"{args.rounds} rounds (median times, launch to exit): the same tokens in **{total_g / total_j:.2f}x** "
               f"fewer forwards, wall time greedy / Jacobi **{time_g / time_j:.2f}x**.")
    publish("jacobi_decoding", "Jacobi decoding against greedy decoding", [table, summary])
    return 0


if __name__ == "__main__":
    sys.exit(main())
