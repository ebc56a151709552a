"""A template filled in place against the same form drawn whole under one grammar: tokens drawn, wall time.

The ``template`` inferlet (inferlets/template) on a real inference process serving SmolLM2-135M-Instruct
on this CPU fills a product sheet (a title, five labelled lines: three one-line holes, two held to a
digits regex) after a chat turn: its fixed text is forwarded, never drawn. The plain way is one
generation under a regex grammar of the whole sheet (``constrained regex``: the fixed text escaped, a
one-line hole ``[^\\n]{1,60}``, the digits holes as they are), where the grammar forces the fixed text
one drawn token at a time. Alternating round by round, one instance at a time; both outputs must be
sheets (each line's label where the template has it). Reported: tokens drawn, launch-to-exit time
(median), and the ratios.

    .venv/bin/python bench/template.py [--rounds 3]
"""

from __future__ import annotations

import json
import re
import statistics
import string
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import doc_parser, markdown_table, publish  # noqa: E402
from library_loop import library_loop  # noqa: E402

PROMPT = "Write a product sheet for a new kitchen gadget."
TEMPLATE = ("PRODUCT SHEET\n=============\nProduct name: {name}\nCategory: {category}\nPrice in US dollars: "
            "{price:[0-9]{1,4}}\nWarranty in years: {warranty:[0-9]}\nOne-line description: {description}\n")


def whole_regex(template: str) -> str:
    """The template as one regex: fixed text escaped, a one-line hole [^\\n]{1,60}, a pattern's hole as given
    (holes read as the inferlet reads them: ``string.Formatter``'s fields)."""
    out = []
    for fixed, name, pattern, _ in string.Formatter().parse(template):
        out.append(re.escape(fixed))
        if name is not None:
            out.append(f"(?:{pattern})" if pattern else r"[^\n]{1,60}")
    return "".join(out)


def parse_args():
    parser = doc_parser(__doc__)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the inference process")
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    labels = [line.split("{")[0] for line in TEMPLATE.splitlines()]
    pattern = whole_regex(TEMPLATE)
    times: dict[str, list[float]] = {"grammar": [], "template": []}
    drawn, texts = {}, {}
    with library_loop("template", args.model, args.threads, others=("constrained",)) as runner:
        runner.run([TEMPLATE, PROMPT, "--chat"])  # compiles both components and warms the process up
        runner.run_program("constrained", ["regex", pattern, PROMPT, "400", "--chat"])
        for r in range(args.rounds):
            took, messages = runner.run_program("constrained", ["regex", pattern, PROMPT, "400", "--chat",
                                                                "--logprobs", "0"])
            times["grammar"].append(took)
            texts["grammar"], drawn["grammar"] = messages[0], len(json.loads(messages[1]))
            took, report = runner.run([TEMPLATE, PROMPT, "--chat"])
            times["template"].append(took)
            texts["template"], drawn["template"] = report["text"], report["drawn_tokens"]
            for case, text in texts.items():
                if [line[:len(label)] for line, label in zip(text.splitlines(), labels)] != labels:
                    raise RuntimeError(f"{case} wrote no sheet:\n{text}")
            print(f"round {r + 1}: grammar {times['grammar'][-1] * 1e3:.0f} ms ({drawn['grammar']} drawn), "
                  f"template {times['template'][-1] * 1e3:.0f} ms ({drawn['template']} drawn)", flush=True)

    med = {case: statistics.median(values) * 1e3 for case, values in times.items()}
    rows = [[case, drawn[case], f"{med[case]:.0f}", f"{min(times[case]) * 1e3:.0f}", f"{max(times[case]) * 1e3:.0f}"]
            for case in times]
    table = markdown_table(["case", "tokens drawn", "median ms", "min", "max"], rows)
    sheets = "\n\n".join(f"{case}:\n\n```\n{text}\n```" for case, text in texts.items())
    summary = (f"{args.model}, {args.threads} torch thread(s), {args.rounds} rounds (launch to exit): the template "
               f"draws **{drawn['grammar'] / drawn['template']:.2f}x** fewer tokens than the whole-sheet grammar "
               f"({drawn['template']} against {drawn['grammar']}); wall time grammar / template "
               f"**{med['grammar'] / med['template']:.2f}x**.")
    publish("template", "A template filled in place against one grammar of the whole form", [table, summary, sheets])
    return 0


if __name__ == "__main__":
    sys.exit(main())
