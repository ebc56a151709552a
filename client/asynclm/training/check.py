"""A check in process: the AsyncLM loop on held-out tasks, greedy, on oven's paged engine (every
task at once, batched) or on transformers + PEFT (decoder.py).

It does what the inferlet does in ``async`` mode, on a simulated clock: the model's tokens are
chosen greedily among those the inferlet's token monitor allows; a call goes to the task's real
tools (the demo tools, BFCL's schema stubs or tool classes) when its ``[END]`` is written and comes
back after its estimated time (time counted in generated tokens at the sample's TPOT), injected
as ``[INTR] id [HEAD] value [END]`` (tokenized on its own) at the next token boundary outside a
CML block; ``[TRAP][END]`` waits for the next result; an end token while results are owed
becomes a trap.

``sync-cml`` samples run the same loop with every result back at once (the inferlet's sync
mode), ``sync`` samples as chat turns of plain calls (:class:`PlainLoop`, plain.py's format).

A demo task passes when the calls made are the expected ones (name and arguments, any order)
and the text outside CML contains every returned value the task's facts list. A BFCL task passes
when its calls are right: for parallel and live-parallel ones, each call matches one of the
ground truth's calls with an acceptable value for every argument (BFCL's possible answers, strings
compared as BFCL's checker does: case, spaces and ``,./-_*^`` aside); for multi-step-parallel
ones, the calls are the ground truth's. A task that needs no call (BFCL irrelevance, an off-topic
request) passes when the model makes none and writes none as prose. ``--example`` gives the model
the prompt's worked example (the few-shot base model of the paper's Table 1). This is a check, not
the evaluation bench.

    python -m oven.client.asynclm.training.check --adapter client/asynclm/adapter --sources demo --tasks 50
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from . import plain, protocol
from ..tools import ToolError, ToolRegistry, parse_call
from .data import VARIANTS, DataConfig, prompt_of, read_meta, read_records, tasks_for
from .decoder import DECODERS
from .held import HeldCalls
from .segments import Encoder
from .tasks import function_name

SOURCES = ("demo", "parallel", "live_parallel", "multi_step_parallel", "multi_turn", "irrelevance", "live_irrelevance")


@dataclass
class Outcome:
    task_id: str
    calls: list[str] = field(default_factory=list)
    text: str = ""
    calls_right: bool = False
    facts_stated: bool = False

    @property
    def passed(self) -> bool:
        return self.calls_right and self.facts_stated


def same_calls(made: list[str], expected: list[str], registry: ToolRegistry | None = None) -> bool:
    """The same calls in any order: names and argument values equal (``amount=250`` is ``amount=250.0``);
    with ``registry``, an argument passed by position is the one it binds to (BFCL's multi-turn ground
    truth writes ``get_zipcode_based_on_city('Rivermist')`` in some samples, ``(city='Rivermist')``
    in others: its checker runs the calls, so both are right)."""
    def parsed(call: str):
        return registry.named(parse_call(call)) if registry is not None else parse_call(call)

    try:
        left = [parsed(call) for call in made]
    except ToolError:
        return False
    for call in map(parsed, expected):
        if call not in left:
            return False
        left.remove(call)
    return not left


def _standard(value):
    """A value as BFCL's checker compares it: strings without case, spaces and ``,./-_*^``."""
    if isinstance(value, str):
        return re.sub(r"[ ,./\-_*^]", "", value).lower()
    if isinstance(value, (list, tuple)):
        return [_standard(v) for v in value]
    if isinstance(value, dict):
        return {k: _standard(v) for k, v in value.items()}
    return value


def _acceptable(value, options: list) -> bool:
    for option in options:
        if isinstance(option, dict) and isinstance(value, dict):
            if option.keys() >= value.keys() and all(
                    k in value and _acceptable(value[k], o) or k not in value and "" in o for k, o in option.items()):
                return True
        elif _standard(value) == _standard(option):
            return True
    return False


def _matches(call, truth: dict) -> bool:
    ((name, options_by_argument),) = truth.items()
    return call.name == name and not call.args and set(call.kwargs) <= set(options_by_argument) and all(
        _acceptable(call.kwargs[k], o) if k in call.kwargs else "" in o for k, o in options_by_argument.items())


def bfcl_calls_right(made: list[str], ground_truth: list[dict]) -> bool:
    """Each ground-truth call made once, with acceptable values, and nothing else (any order)."""
    try:
        calls = [parse_call(call) for call in made]
    except ToolError:
        return False
    if len(calls) != len(ground_truth):
        return False
    left = list(calls)
    for truth in ground_truth:
        match = next((c for c in left if _matches(c, truth)), None)
        if match is None:
            return False
        left.remove(match)
    return True


class Loop:
    """One session of one task on a decoder's session (decoder.py: the model, with or without an
    adapter); the model starts after ``prompt_ids`` (default: the sample's own prompt)."""

    def __init__(self, session, encoder: Encoder, record: dict, max_new_tokens: int, registry: ToolRegistry,
                 prompt_ids: list[int] | None = None, held: HeldCalls | None = None):
        cml = protocol.cml()
        self.session, self.encoder, self.record = session, encoder, record
        self.max_new_tokens = max_new_tokens
        self.prompt_ids = prompt_ids or prompt_of(record)
        self.held = held  # --constrain: each call's text held to the tools' schemas (held.py)
        self.monitor = cml.TokenMonitor(lambda token: encoder.decode([token]), named_calls=held is not None)
        self.registry = registry
        self.stop_ids = set(encoder.tokenizer.stop_token_ids)
        self.now_ms, self.queue, self.forced = 0.0, [], []
        self.outcome = Outcome(record["task_id"])

    def run(self) -> Outcome:
        ids = list(self.prompt_ids)
        for _ in range(self.max_new_tokens):
            token = self._choose(self.session.ranked(ids), ids)
            if token is None:
                break
            ids.append(token)
            self.now_ms += self.record["tpot_ms"]
            for event in self.monitor.feed(token):
                self._on(event)
            if self.monitor.interruptible:
                ids += self._inject()
        for event in self.monitor.flush():
            self._on(event)
        return _scored(self.outcome, self.record, self.registry)

    def _choose(self, ranked: list[int], ids: list[int]) -> int | None:
        if self.forced:
            return self.forced.pop(0)
        if self.held is not None and (self.held.open or self.monitor.call_body_start):
            return self.held.choose(ranked, lambda: self.session.ranked(ids, self.held.vocab_size))
        for token in ranked:
            if token in self.stop_ids:
                if self.monitor.in_critical_section:
                    continue
                if self.queue:  # results are owed: the inferlet makes the model wait instead
                    self.forced = self.encoder.encode(protocol.prompt().TRAP_TEXT)
                    return self.forced.pop(0)
                return None
            if self.monitor.allowed(token):
                return token
        return None

    def _on(self, event) -> None:
        cml = protocol.cml()
        if isinstance(event, cml.Text):
            self.outcome.text += event.text
        elif isinstance(event, cml.Call):
            self.outcome.calls.append(event.call)
            try:
                value, name = self.registry.execute(event.call), function_name(event.call)
            except ToolError as exc:
                value, name = f"error: {exc}", ""
            # sync-cml: the call waits for its result, which comes in before the model writes on
            delay_ms = 0 if self.record["variant"] == "sync-cml" else self.record["estimates_ms"].get(name, 0)
            self.queue.append((self.now_ms + delay_ms, len(self.outcome.calls), event.call_id, value))
        elif isinstance(event, cml.Trap) and self.queue:
            self.now_ms = max(self.now_ms, min(e[0] for e in self.queue))

    def _inject(self) -> list[int]:
        due = sorted(e for e in self.queue if e[0] <= self.now_ms)
        ids = []
        for event in due:
            self.queue.remove(event)
            if event[2] is None:
                continue
            text = protocol.prompt().interrupt_text(event[2], event[3])
            self.monitor.feed_text(text)
            ids += self.encoder.encode(text)
        return ids


class PlainLoop:
    """One ``sync`` session: the model writes a turn; a turn of calls only (one per line) gets a
    ``tool`` turn with their results (plain.py's format) and the model goes on; any other turn is
    the answer."""

    def __init__(self, session, encoder: Encoder, record: dict, max_new_tokens: int, registry: ToolRegistry,
                 system: str):
        self.session, self.encoder, self.record, self.registry = session, encoder, record, registry
        self.max_new_tokens, self.system = max_new_tokens, system
        self.stop_ids = set(encoder.tokenizer.stop_token_ids)
        self.outcome = Outcome(record["task_id"])

    def run(self) -> Outcome:
        messages = [{"role": "system", "content": self.system}, {"role": "user", "content": self.record["question"]}]
        budget = self.max_new_tokens
        while budget > 0:
            written = greedy(self.session, self.encoder.encode(self.encoder.chat(messages)), budget, self.stop_ids)
            budget -= len(written) + 1
            content = self.encoder.decode(written).strip()
            calls = _plain_calls(content)
            if not calls:
                self.outcome.text = content
                break
            pairs = []
            for call in calls:
                try:
                    pairs.append((call, self.registry.execute(call)))
                except ToolError as exc:
                    pairs.append((call, f"error: {exc}"))
            self.outcome.calls += calls
            messages += [{"role": "assistant", "content": content},
                         {"role": "tool", "content": plain.results_text(pairs)}]
        return _scored(self.outcome, self.record, self.registry)


def _scored(outcome: Outcome, record: dict, registry: ToolRegistry) -> Outcome:
    """``outcome`` with its verdicts against the sample (see :func:`judged`)."""
    outcome.calls_right, outcome.facts_stated = judged(record, outcome.calls, outcome.text, registry)
    return outcome


def judged(record: dict, calls: list[str], text: str, registry: ToolRegistry) -> tuple[bool, bool]:
    """Whether ``calls`` are right, and whether ``text`` states every returned value, on ``record``'s
    task: calls judged by BFCL's possible answers where BFCL has them (parallel, live_parallel),
    else against the sample's own calls; a task that needs none is right when the model neither makes
    a call nor writes one as prose (``get_weather(city=" the sea")`` in its text)."""
    if not record["calls"]:
        right = not calls and not registry.calls_written_in(text)
    elif (truth := ground_truth(record)) is not None:
        right = bfcl_calls_right(calls, truth)
    else:
        right = same_calls(calls, record["calls"], registry)
    return right, all(fact in text for fact in record["facts"])


def _plain_calls(content: str) -> list[str]:
    """The calls of a turn whose every line is one call, else none (the turn is an answer)."""
    lines = [line.strip() for line in content.splitlines() if line.strip()]
    try:
        for line in lines:
            parse_call(line)
    except ToolError:
        return []
    return lines


def greedy(session, prompt_ids: list[int], max_new_tokens: int, stop_ids: set[int]) -> list[int]:
    """The tokens a decoder's ``session`` writes greedily after ``prompt_ids``, up to a stop token (not included)."""
    written: list[int] = []
    for _ in range(max_new_tokens):
        token = session.ranked(list(prompt_ids) + written)[0]
        if token in stop_ids:
            break
        written.append(token)
    return written


def token_budget(record: dict) -> int:
    """Tokens the model may write: half again what the sample's ideal model wrote, and 32 more."""
    return 32 + 3 * sum(end - start for start, end in record["loss_spans"]) // 2


def system_text(record: dict, example: bool = False) -> str:
    """The sample's system prompt (its variant's rules), with the worked example if ``example``."""
    prompt = protocol.prompt()
    rules = prompt.PLAIN_RULES if record["variant"] == "sync" else prompt.RULES
    return prompt.system_prompt(record["functions"], example=example, rules=rules)


def run_task(decoder, encoder: Encoder, record: dict, registry: ToolRegistry, example: bool = False,
             constrain: bool = False) -> Outcome:
    """One greedy session of ``record``'s task in its variant on a session of ``decoder``
    (decoder.py); ``example``: the prompt's worked example; ``constrain``: CML calls held to the
    tools' schemas (held.py; the ``sync`` variant's plain calls are not CML and are left free)."""
    held = HeldCalls(registry, encoder.tokenizer) if constrain and record["variant"] != "sync" else None
    session = decoder.session()
    try:
        if record["variant"] == "sync":
            return PlainLoop(session, encoder, record, token_budget(record), registry,
                             system_text(record, example)).run()
        prompt_ids = encoder.prompt(system_text(record, True), record["question"]).token_ids if example else None
        return Loop(session, encoder, record, token_budget(record), registry, prompt_ids, held).run()
    finally:
        session.close()


def check(decoder, encoder: Encoder, records: list[dict], registry_for: Callable[[dict], ToolRegistry],
          example: bool = False, log=print, constrain: bool = False) -> list[Outcome]:
    """Run each record's task on ``decoder``, as many at once as it has sessions (threads; an
    ``EngineDecoder`` batches their steps). Outcomes and log lines come in the records' order."""
    from concurrent.futures import ThreadPoolExecutor

    def one(record: dict) -> Outcome:
        return run_task(decoder, encoder, record, registry_for(record), example, constrain)

    outcomes = []
    with ThreadPoolExecutor(decoder.max_sessions) as pool:
        for record, outcome in zip(records, pool.map(one, records)):
            outcomes.append(outcome)
            log(f"{'PASS' if outcome.passed else 'fail'} {record['task_id']}: {record['question'][:300]}\n"
                f"     calls {'ok ' if outcome.calls_right else 'BAD'} {outcome.calls} (expected {record['calls']})\n"
                f"     facts {'ok ' if outcome.facts_stated else 'BAD'} {record['facts']} in {outcome.text.strip()!r}")
    return outcomes


def _registries(data: Path) -> dict[str, Callable[[], ToolRegistry]]:
    """Each evaluation task's tools by task id, rebuilt as ``oven asynclm-data`` built them (the
    arguments in ``data.json``: BFCL tasks list functions drawn from one random stream)."""
    args = read_meta(data.parent).get("args", {})
    defaults = DataConfig()
    config = DataConfig(seed=args.get("seed", defaults.seed), demo_eval=args.get("demo_eval", defaults.demo_eval),
                        multi_step_eval=args.get("multi_step_eval", defaults.multi_step_eval),
                        sources=tuple(s for s in args.get("sources", ",".join(defaults.sources)).split(",") if s))
    return {task.task_id: task.registry for task in tasks_for("eval", config)}


def ground_truth(record: dict) -> list[dict] | None:
    if record["source"] not in ("parallel", "live_parallel"):
        return None
    from ..tools.bfcl import FILE_BY_KIND
    from ..tools.bfcl_data import ground_truth_by_id
    return ground_truth_by_id(FILE_BY_KIND[record["source"]])[record["task_id"]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m oven.client.asynclm.training.check", description=__doc__.split(
        "\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="asynclm-data/eval.jsonl", help="evaluation samples (default %(default)s)")
    parser.add_argument("--adapter", help="a PEFT adapter folder (default: the base model alone)")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="default %(default)s")
    parser.add_argument("--sources", default="demo", help=f"comma-separated, of {', '.join(SOURCES)} "
                        "(default %(default)s)")
    parser.add_argument("--variant", choices=VARIANTS, default="async", help="default %(default)s")
    parser.add_argument("--tasks", type=int, default=50, help="samples per source (default %(default)s)")
    parser.add_argument("--parallel", type=int, default=32,
                        help="tasks decoded at once on the engine (default %(default)s; memory grows with it)")
    parser.add_argument("--start", type=int, default=0,
                        help="skip this many of each source first (default %(default)s)")
    parser.add_argument("--example", action="store_true", help="put the worked example in the prompt (few-shot)")
    parser.add_argument("--constrain", action="store_true",
                        help="hold the CML calls to the tools' schemas, as `oven asynclm --constrain` does")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: one per core)")
    parser.add_argument("--decoder", choices=DECODERS, default="engine",
                        help="oven's paged engine, every task at once in one batch (the served numbers), or "
                             "transformers + PEFT, one task at a time (the reference) (default %(default)s)")
    parser.add_argument("--json", help="write the outcomes here")
    args = parser.parse_args(argv)
    import os

    from oven.control.tokenizer import Tokenizer

    from .decoder import make_decoder

    sources = tuple(s for s in args.sources.split(",") if s)
    try:
        if set(sources) - set(SOURCES):
            raise ValueError(f"--sources must be some of {', '.join(SOURCES)}")
        if args.parallel < 1:
            raise ValueError("--parallel must be at least 1")
        data = Path(args.data)
        records = [r for r in read_records(data) if r["variant"] == args.variant]
        chosen = [r for source in sources
                  for r in [r for r in records if r["source"] == source][args.start:args.start + args.tasks]]
        registry_by_id = _registries(data)
        decoder, source = make_decoder(args.decoder, args.model, Path(args.adapter) if args.adapter else None,
                                       args.threads or os.cpu_count() or 1, max(1, min(args.parallel, len(chosen))))
    except (FileNotFoundError, ValueError, ModuleNotFoundError) as exc:
        print(f"check: error: {exc}", file=sys.stderr)
        return 1
    try:
        outcomes = check(decoder, Encoder(Tokenizer(source.tokenizer)), chosen,
                         lambda r: registry_by_id[r["task_id"]](), args.example, constrain=args.constrain)
    finally:
        decoder.close()
    label = (args.adapter or "base model") + f", {args.variant}" + (", worked example" if args.example else "") \
        + (", constrained" if args.constrain else "")
    summary = {}
    for name in sources:
        mine = [o for o, r in zip(outcomes, chosen) if r["source"] == name]
        summary[name] = {"tasks": len(mine), "passed": sum(o.passed for o in mine),
                         "calls_right": sum(o.calls_right for o in mine),
                         "facts_stated": sum(o.facts_stated for o in mine)}
        print(f"{name}: {summary[name]['passed']}/{len(mine)} passed: calls right {summary[name]['calls_right']}, "
              f"facts stated {summary[name]['facts_stated']} ({label})")
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "outcomes": [o.__dict__ for o in outcomes]},
                                              indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
