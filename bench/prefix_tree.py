"""Prefix-tree generation against independent generation per leaf: prefill tokens and wall time, side by side.

The ``prefix-tree`` inferlet (inferlets/prefix-tree) on a real inference process serving
SmolLM2-135M-Instruct on this CPU, one instance at a time: a tree of 1 x 2 x 2 x 2 prompts (a system
prompt, two topics, two audiences each, two follow-ups each: 8 leaves) generated as a tree (every
shared prefix forwarded once, the leaves forked from it) and with ``--independent`` (each leaf's
whole prompt forwarded on its own), alternating round by round; the leaves' tokens must be equal.
Reported: prompt tokens forwarded, launch-to-exit time (median), and the ratios independent / tree.

    .venv/bin/python bench/prefix_tree.py [--max-new-tokens 16] [--rounds 3]
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import doc_parser, markdown_table, publish  # noqa: E402
from library_loop import library_loop  # noqa: E402

SYSTEM = ("System: you are a science tutor for students of every age. Explain each idea step by step, "
          "choose words that suit the student, give one concrete example, and keep every answer short.\n")
TOPICS = {"User: how do green plants make their own food from sunlight, water and carbon dioxide?\n": [
              "User: please make it simpler, as if I were six years old.\n",
              "User: now give me the version a high-school biology class would expect.\n"],
          "User: how do cells turn the sugar they take in into energy they can use?\n": [
              "User: which parts of the cell do this work, and why are they shaped that way?\n",
              "User: what comes out at the end of this process, and why does each product matter?\n"]}
FOLLOW_UPS = ["User: compare it with cooking a meal from a recipe.\nTutor:",
              "User: what would change if the light or the food ran out?\nTutor:"]


def tree() -> dict:
    return {"text": SYSTEM, "children": [
        {"text": topic, "children": [{"text": audience, "children": [{"text": f} for f in FOLLOW_UPS]}
                                     for audience in audiences]}
        for topic, audiences in TOPICS.items()]}


def parse_args():
    parser = doc_parser(__doc__)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the inference process")
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    cases = {"independent": ["--independent"], "tree": []}
    times = {case: [] for case in cases}
    reports = {}
    tree_json = json.dumps(tree())
    with library_loop("prefix-tree", args.model, args.threads) as runner:
        runner.run([json.dumps({"text": SYSTEM}), "2"])  # compiles the component and warms the process up
        for r in range(args.rounds):
            for case, flags in cases.items():
                took, reports[case] = runner.run([tree_json, str(args.max_new_tokens), *flags])
                times[case].append(took)
            if [leaf["tokens"] for leaf in reports["tree"]["leaves"]] != \
                    [leaf["tokens"] for leaf in reports["independent"]["leaves"]]:
                raise RuntimeError("the tree's leaves differ from the independent generations")
            print(f"round {r + 1}: independent {times['independent'][-1] * 1e3:.0f} ms, "
                  f"tree {times['tree'][-1] * 1e3:.0f} ms", flush=True)

    med = {case: statistics.median(values) * 1e3 for case, values in times.items()}
    prefill = {case: reports[case]["prefill_tokens"] for case in cases}
    rows = [[case, prefill[case], f"{med[case]:.0f}", f"{min(times[case]) * 1e3:.0f}", f"{max(times[case]) * 1e3:.0f}"]
            for case in cases]
    table = markdown_table(["case", "prompt tokens forwarded", "median ms", "min", "max"], rows)
    num_leaves = len(reports["tree"]["leaves"])
    summary = (f"{args.model}, {num_leaves} leaves, {args.max_new_tokens} new tokens each, {args.threads} torch "
               f"thread(s), {args.rounds} rounds (launch to exit): the same tokens with "
               f"**{prefill['independent'] / prefill['tree']:.2f}x** fewer prompt tokens forwarded, wall time "
               f"independent / tree **{med['independent'] / med['tree']:.2f}x**.")
    publish("prefix_tree", "Prefix-tree generation against independent generation", [table, summary])
    return 0


if __name__ == "__main__":
    sys.exit(main())
