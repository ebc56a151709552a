"""AsyncLM abstaining: how often the model makes no call when none of its tools applies.

BFCL's ``irrelevance`` and ``live_irrelevance`` sets give a request beside tools that cannot serve it
(the right answer is no call); ``demo`` is the held-out off-topic requests beside the demo tools
(``OFF_TOPIC_HELD_OUT``: a joke, a haiku). BFCL's ``parallel`` is the counter-check: its tools do
serve the request, so a session there with no call refuses wrongly (an adapter that refuses everything
would otherwise pass). The first ``--samples`` held-out entries of each set (BFCL: the split's
evaluation ids, in file order) run as ``oven asynclm`` sessions (async mode, the tools'
schemas as BFCL gives them, stub results) on one embedded server, with the shipped adapter (``FT``)
and with the base model and its worked example (``base``); a session abstains when it makes no call
and writes none as prose (a tool's ``name(`` in its text: a call that missed the CML markup).
Writes ``results/asynclm_abstain.md``.

    .venv/bin/python bench/asynclm_abstain.py [--samples 20] [--models FT,base]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import markdown_table, publish  # noqa: E402

from oven.client.asynclm.session import Workload, run_session, session_spec  # noqa: E402
from oven.client.asynclm.tools.bfcl import stub_registry  # noqa: E402
from oven.client.asynclm.tools.bfcl_data import question_text, read_entries  # noqa: E402
from oven.client.asynclm.tools.demo import demo_registry  # noqa: E402
from oven.client.asynclm.training.bfcl_tasks import IRRELEVANCE_KINDS  # noqa: E402
from oven.client.asynclm.training.demo_tasks import OFF_TOPIC_HELD_OUT  # noqa: E402
from oven.client.asynclm.training.split import bfcl_ids  # noqa: E402
from oven.client.connect import embedded_server  # noqa: E402
from oven.client.programs import library_program  # noqa: E402
from oven.inference.config import DEFAULT_MODEL  # noqa: E402
from oven.proto.auth import default_state_dir  # noqa: E402

SETS = (*IRRELEVANCE_KINDS, "demo", "parallel")
NEEDS_CALLS = {"parallel"}  # the sets whose right answer is a call: abstaining there is a wrong refusal
MODELS = {"FT": {"adapter": "asynclm"}, "base": {"example": True}}
GOAL = 0.90  # issue 43: abstains on at least 90 % of the held-out irrelevance samples


def held_out(set_name: str) -> list[Workload]:
    """The held-out requests of ``set_name`` as sessions with their tools, in file order."""
    if set_name == "demo":
        return [Workload(f"off_topic_{i}", question, demo_registry(), latency=lambda call: 0.0)
                for i, question in enumerate(OFF_TOPIC_HELD_OUT)]
    held = set(bfcl_ids(set_name, "eval"))
    return [Workload(entry["id"], question_text(entry["question"][0]), stub_registry(entry["function"]),
                     latency=lambda call: 0.0)
            for entry in read_entries(f"BFCL_v4_{set_name}.json") if entry["id"] in held]


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

    no_call: dict[tuple[str, str], list[bool]] = {}
    start = time.monotonic()
    asynclm = library_program("asynclm")
    with embedded_server(args.model, default_state_dir()) as client:
        program = client.upload_file(asynclm.path, asynclm.name)
        for set_name in SETS:
            for workload in held_out(set_name)[:args.samples]:
                for model in models:
                    spec = session_spec(workload, "async", max_tokens=args.max_tokens, **MODELS[model])
                    session = run_session(client, program, workload, spec)
                    if session.exit_code != 0:
                        raise SystemExit(f"{workload.name} ({model}): {session.error or session.exit_code}")
                    calls, prose = session.calls, workload.registry.calls_written_in(session.text)
                    no_call.setdefault((model, set_name), []).append(not calls and not prose)
                    verdict = ("called " + "; ".join(calls) if calls else
                               "wrote a call as prose: " + session.text.strip() if prose else "no call")
                    print(f"{workload.name:>24} {model:<5} {verdict}"[:200], flush=True)

    def cell(model: str, set_name: str) -> str:
        ok = no_call[model, set_name]
        return f"{100 * sum(ok) / len(ok):.0f} % ({sum(ok)}/{len(ok)})"

    rows = [[s, "calls" if s in NEEDS_CALLS else "no call", len(no_call[models[0], s]), *[cell(m, s) for m in models]]
            for s in SETS]
    table = markdown_table(["set", "right answer", "samples", *[f"{m}: no call" for m in models]], rows)

    def goal_line(model: str) -> str:  # the goal counts BFCL's two sets, the held-out ids of each
        ok = [x for s in IRRELEVANCE_KINDS for x in no_call[model, s]]
        refused = [r for s in NEEDS_CALLS for r in no_call[model, s]]
        return (f"- {model}: {100 * sum(ok) / len(ok):.0f} % abstained over both BFCL sets (goal ≥ {GOAL:.0%}), "
                f"while refusing {sum(refused)} of {len(refused)} requests its tools serve "
                f"({', '.join(sorted(NEEDS_CALLS))})")
    goals = [goal_line(m) for m in models]
    sections = [f"Model `{args.model}`; async mode, greedy, {args.max_tokens} tokens at most; the first {args.samples} "
                f"held-out entries of each set; {time.monotonic() - start:.0f} s.",
                "## Sessions with no call\n\n" + table,
                "## Goal (issue 43)\n\n" + "\n".join(goals)]
    publish("asynclm_abstain", "AsyncLM: abstaining where no tool applies", sections)
    return 0


if __name__ == "__main__":
    sys.exit(main())
