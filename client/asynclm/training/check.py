"""A quick check in process: the AsyncLM loop on held-out demo tasks with transformers (+ PEFT), greedy.

It does what the inferlet does in ``async`` mode, on a simulated clock: the model's tokens are
chosen greedily among those the inferlet's token monitor allows; a call goes to the real demo
tool when its ``[END]`` is written and comes back after its estimated time (time counted in
generated tokens at the sample's TPOT), injected as ``[INTR] id [HEAD] value [END]`` (tokenized on
its own) at the next token boundary outside a CML block; ``[TRAP][END]`` waits for the next
result; an end token while results are owed becomes a trap. A task passes when the calls made
are the expected ones (name and arguments, any order) and the text outside CML contains every
returned value the task's facts list. This is a sanity check, not the evaluation bench.

    python -m oven.client.asynclm.training.check --adapter asynclm-adapter [--tasks 20]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from . import protocol
from ..tools import ToolError, demo_registry, parse_call
from .data import read_records
from .segments import Encoder
from .tasks import function_name

TOP_K = 64


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


def same_calls(made: list[str], expected: list[str]) -> bool:
    """The same calls in any order: names and argument values equal (``amount=250`` is ``amount=250.0``)."""
    try:
        left = [parse_call(call) for call in made]
    except ToolError:
        return False
    for call in map(parse_call, expected):
        if call not in left:
            return False
        left.remove(call)
    return not left


class Loop:
    """One session of one task on ``model`` (a causal LM, with or without an adapter)."""

    def __init__(self, model, encoder: Encoder, record: dict, max_new_tokens: int):
        cml = protocol.cml()
        self.model, self.encoder, self.record = model, encoder, record
        self.max_new_tokens = max_new_tokens
        self.monitor = cml.TokenMonitor(lambda token: encoder.decode([token]))
        self.registry = demo_registry()
        self.stop_ids = set(encoder.tokenizer.stop_token_ids)
        self.now_ms, self.queue, self.forced = 0.0, [], []
        self.outcome = Outcome(record["task_id"])

    def run(self) -> Outcome:
        import torch

        prompt_ids = self.record["ids"][:self.record["loss_spans"][0][0]]
        cache, pending = None, list(prompt_ids)
        with torch.no_grad():
            for _ in range(self.max_new_tokens):
                out = self.model(input_ids=torch.tensor([pending]), past_key_values=cache, use_cache=True)
                cache = out.past_key_values
                token = self._choose(out.logits[0, -1].topk(TOP_K).indices.tolist())
                if token is None:
                    break
                pending = [token]
                self.now_ms += self.record["tpot_ms"]
                for event in self.monitor.feed(token):
                    self._on(event)
                if not self.monitor.in_critical_section:
                    pending += self._inject()
        for event in self.monitor.flush():
            self._on(event)
        self.outcome.calls_right = same_calls(self.outcome.calls, self.record["calls"])
        self.outcome.facts_stated = all(fact in self.outcome.text for fact in self.record["facts"])
        return self.outcome

    def _choose(self, ranked: list[int]) -> int | None:
        if self.forced:
            return self.forced.pop(0)
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
            delay_ms = self.record["estimates_ms"].get(name, 0)
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
        if ids and self.forced and not self.encoder.decode(self.forced).strip():
            self.forced = []
        return ids


def token_budget(record: dict) -> int:
    """Tokens the model may write: half again what the sample's ideal model wrote, and 32 more."""
    return 32 + 3 * sum(end - start for start, end in record["loss_spans"]) // 2


def check(model, encoder: Encoder, records: list[dict], log=print) -> list[Outcome]:
    outcomes = []
    for record in records:
        outcome = Loop(model, encoder, record, token_budget(record)).run()
        outcomes.append(outcome)
        log(f"{'PASS' if outcome.passed else 'fail'} {record['task_id']}: {record['question']}\n"
            f"     calls {'ok ' if outcome.calls_right else 'BAD'} {outcome.calls}\n"
            f"     facts {'ok ' if outcome.facts_stated else 'BAD'} {record['facts']} in {outcome.text.strip()!r}")
    return outcomes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m oven.client.asynclm.training.check", description=__doc__.split(
        "\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="asynclm-data/eval.jsonl", help="evaluation samples (default %(default)s)")
    parser.add_argument("--adapter", help="a PEFT adapter folder (default: the base model alone)")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="default %(default)s")
    parser.add_argument("--tasks", type=int, default=20, help="held-out demo tasks (default %(default)s)")
    parser.add_argument("--start", type=int, default=0, help="skip this many tasks first (default %(default)s)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: one per core)")
    parser.add_argument("--json", help="write the outcomes here")
    args = parser.parse_args(argv)
    import os

    import torch

    from oven.control.tokenizer import Tokenizer

    from .model import load_base

    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    try:
        records = [r for r in read_records(Path(args.data)) if r["source"] == "demo" and r["variant"] == "async"]
        model, source = load_base(args.model, 0)
        if args.adapter:
            from peft import PeftModel
            model = PeftModel.from_pretrained(model, args.adapter)
    except (FileNotFoundError, ValueError) as exc:
        print(f"check: error: {exc}", file=sys.stderr)
        return 1
    model.eval()
    outcomes = check(model, Encoder(Tokenizer(source.tokenizer)), records[args.start:args.start + args.tasks])
    passed = sum(o.passed for o in outcomes)
    print(f"{passed}/{len(outcomes)} passed: calls right {sum(o.calls_right for o in outcomes)}, "
          f"facts stated {sum(o.facts_stated for o in outcomes)} ({args.adapter or 'base model'})")
    if args.json:
        Path(args.json).write_text(json.dumps([o.__dict__ for o in outcomes], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
