"""AsyncLM abstaining: how often the model makes no call when none of its tools applies.

BFCL's ``irrelevance`` and ``live_irrelevance`` sets give a request beside tools that cannot serve it
(the right answer is no call). Each of the first ``--samples`` entries of each set runs as an
``oven asynclm`` session (async mode, the tools' schemas as BFCL gives them, stub results) on one
embedded server, with the shipped adapter (``FT``) and with the base model and its worked example
(``base``); a session abstains when it writes no call. No entry of either set was in training, so
every one is held out. Writes ``results/asynclm_abstain.md``.

    .venv/bin/python bench/asynclm_abstain.py [--samples 20] [--models FT,base]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import markdown_table, write_results  # noqa: E402

from oven.client.asynclm.session import Workload, run_session, session_spec  # noqa: E402
from oven.client.asynclm.tools.bfcl import stub_registry  # noqa: E402
from oven.client.asynclm.tools.bfcl_data import question_text, read_entries  # noqa: E402
from oven.client.connect import embedded_server  # noqa: E402
from oven.client.programs import library_program  # noqa: E402
from oven.inference.config import DEFAULT_MODEL  # noqa: E402
from oven.proto.auth import default_state_dir  # noqa: E402

SETS = {"irrelevance": "BFCL_v4_irrelevance.json", "live_irrelevance": "BFCL_v4_live_irrelevance.json"}
MODELS = {"FT": {"adapter": "asynclm"}, "base": {"example": True}}
GOAL = 0.90  # issue 43: abstains on at least 90 % of the held-out irrelevance samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=20, help="entries per set, from the first (default %(default)s)")
    parser.add_argument("--models", default=",".join(MODELS), help="default %(default)s")
    parser.add_argument("--max-tokens", type=int, default=96, help="each session's token budget (default %(default)s)")
    parser.add_argument("--model", default=DEFAULT_MODEL)
    args = parser.parse_args()
    models = [m for m in args.models.split(",") if m]
    if not models or set(models) - set(MODELS):
        parser.error(f"--models must be some of {', '.join(MODELS)}")

    abstained: dict[tuple[str, str], list[bool]] = {}
    start = time.monotonic()
    asynclm = library_program("asynclm")
    with embedded_server(args.model, default_state_dir()) as client:
        program = client.upload_file(asynclm.path, asynclm.name)
        for set_name, file_name in SETS.items():
            for entry in read_entries(file_name)[:args.samples]:
                registry = stub_registry(entry["function"])
                workload = Workload(entry["id"], question_text(entry["question"][0]), registry,
                                    latency=lambda call: 0.0)
                for model in models:
                    spec = session_spec(workload, "async", max_tokens=args.max_tokens, **MODELS[model])
                    session = run_session(client, program, workload, spec)
                    if session.exit_code != 0:
                        raise SystemExit(f"{entry['id']} ({model}): {session.error or session.exit_code}")
                    calls = [e["call"] for e in session.trace if e.get("type") == "call"]
                    abstained.setdefault((model, set_name), []).append(not calls)
                    print(f"{entry['id']:>24} {model:<5} {'abstained' if not calls else 'called ' + '; '.join(calls)}"[:200],
                          flush=True)

    def cell(model: str, set_name: str) -> str:
        ok = abstained[model, set_name]
        return f"{100 * sum(ok) / len(ok):.0f} % ({sum(ok)}/{len(ok)})"

    rows = [[s, args.samples, *[cell(m, s) for m in models]] for s in SETS]
    table = markdown_table(["set", "samples", *[f"{m} abstains" for m in models]], rows)
    goals = [f"- {m}: {100 * sum(sum(v) for (mm, _), v in abstained.items() if mm == m) / (args.samples * len(SETS)):.0f} "
             f"% abstained over both sets (goal ≥ {GOAL:.0%})" for m in models]
    sections = [f"Model `{args.model}`; async mode, greedy, {args.max_tokens} tokens at most; the first {args.samples} "
                f"entries of each set; {time.monotonic() - start:.0f} s.",
                "## Sessions with no call\n\n" + table,
                "## Goal (issue 43)\n\n" + "\n".join(goals)]
    path = write_results("asynclm_abstain", "AsyncLM: abstaining where no tool applies", sections)
    print(path.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
