"""Can a model tell a request no tool serves from one its tools do, before it writes? Two scores of
each held-out request, and how well each ranks the two kinds apart.

* ``margin``: at the reply's first position, the logit of the no-call reply's first token over the
  best other token. The model decides there whether to abstain or to start a call, so a logit bias on
  that one token (which the inferlet could add) is a threshold on this score.
* ``pmi``: the request's mean token log-probability after the system prompt (the tools) minus its mean
  without it: how much the tools explain the request. It needs no abstaining training.

For each score: its mean per source, the AUC of the requests that need no call (BFCL ``irrelevance``
and ``live_irrelevance``) against BFCL ``parallel`` (whose tools serve the request), and a table of
thresholds: how many irrelevance requests would abstain and how many ``parallel`` ones would be
refused at each. transformers + PEFT, one request at a time (a forward or two each).

    python -m oven.client.asynclm.training.relevance --data data0/eval.jsonl --adapter X --score margin
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import NamedTuple

from oven.inference.config import DEFAULT_MODEL

from .bfcl_tasks import IRRELEVANCE_KINDS, NO_CALL_REPLY

CALL_SOURCE = "parallel"
SCORES = ("margin", "pmi")
USER_HEADER = "<|im_start|>user\n"  # ChatML, the template of SmolLM2 and of the tests' tiny model


class Markers(NamedTuple):
    turn_start: int  # the token that opens a chat turn
    user_header: int  # the tokens of USER_HEADER
    no_call: int  # the no-call reply's first token, as the model writes it


def markers(tokenizer) -> Markers:
    header = tokenizer.encode(USER_HEADER)
    return Markers(header[0], len(header), tokenizer.encode(NO_CALL_REPLY)[0])


def request_span(ids: list[int], marks: Markers) -> tuple[int, int, int]:
    """In a prompt that ends with the assistant's turn opening: where the last user turn starts, where
    its text starts (after ``USER_HEADER``) and where the assistant's turn starts."""
    starts = [i for i, token in enumerate(ids) if token == marks.turn_start]
    if len(starts) < 2:
        raise ValueError("the prompt has no user turn before the assistant's")
    user, assistant = starts[-2], starts[-1]
    return user, user + marks.user_header, assistant


def first_margin(model, ids: list[int], token: int) -> float:
    import torch

    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, -1].float()
    chosen = logits[token].item()
    logits[token] = float("-inf")
    return chosen - logits.max().item()


def _mean_logprob(model, ids: list[int], first: int, end: int) -> float:
    """The mean log-probability of ``ids[first:end]``, each after what precedes it."""
    import torch

    with torch.no_grad():
        logprobs = model(input_ids=torch.tensor([ids[:end]])).logits[0].float().log_softmax(-1)
    targets = torch.tensor(ids[first:end])
    return logprobs[first - 1:end - 1].gather(1, targets[:, None]).mean().item()


def request_pmi(model, ids: list[int], marks: Markers) -> float:
    user, text, assistant = request_span(ids, marks)
    return _mean_logprob(model, ids, text, assistant) - _mean_logprob(model, ids[user:], text - user, assistant - user)


def auc(higher: list[float], lower: list[float]) -> float:
    """How often a score of ``higher`` exceeds one of ``lower`` (ties count half): 0.5 is chance."""
    wins = sum((a > b) + 0.5 * (a == b) for a in higher for b in lower)
    return wins / (len(higher) * len(lower))


def thresholds(no_call: list[float], call: list[float], rows: int = 8) -> list[tuple[float, int, int]]:
    """At each of ``rows`` thresholds (the no-call scores from the highest down, evenly spaced in
    rank): the threshold, the no-call requests at or above it, the call requests at or above it."""
    ranked = sorted(no_call, reverse=True)
    step = max(1, len(ranked) // rows)
    return [(t, sum(s >= t for s in no_call), sum(s >= t for s in call)) for t in ranked[step - 1::step][:rows]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m oven.client.asynclm.training.relevance",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="asynclm-data/eval.jsonl", help="evaluation samples (default %(default)s)")
    parser.add_argument("--adapter", help="a PEFT adapter folder (default: the base model alone)")
    parser.add_argument("--model", default=DEFAULT_MODEL, help="default %(default)s")
    parser.add_argument("--score", choices=SCORES, default="margin", help="default %(default)s")
    parser.add_argument("--tasks", type=int, default=120, help="requests per source, first in file order "
                        "(default %(default)s)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: one per core)")
    parser.add_argument("--json", help="write every score here")
    args = parser.parse_args(argv)
    import torch

    from oven.control.tokenizer import Tokenizer

    from .data import prompt_of, read_records
    from .model import load_base, with_adapter

    scores: dict[str, list[float]] = {}
    try:
        if args.tasks < 1:
            raise ValueError("--tasks must be at least 1")
        records = [r for r in read_records(Path(args.data)) if r["variant"] == "async"]
        prompts = {name: [prompt_of(r) for r in records if r["source"] == name][:args.tasks]
                   for name in (*IRRELEVANCE_KINDS, CALL_SOURCE)}
        if not any(prompts[name] for name in IRRELEVANCE_KINDS) or not prompts[CALL_SOURCE]:
            raise ValueError(f"{args.data} has no irrelevance or no {CALL_SOURCE} samples")
        base, source = load_base(args.model, 0)
        model = (with_adapter(base, Path(args.adapter)) if args.adapter else base).eval()
        torch.set_num_threads(args.threads or os.cpu_count() or 1)
        marks = markers(Tokenizer(source.tokenizer))
        for name, mine in prompts.items():
            scores[name] = [first_margin(model, ids, marks.no_call) if args.score == "margin"
                            else request_pmi(model, ids, marks) for ids in mine]
            print(f"{name}: {len(mine)} requests, mean {args.score} "
                  f"{sum(scores[name]) / max(1, len(mine)):+.3f}", flush=True)
    except (FileNotFoundError, ValueError) as exc:
        print(f"relevance: error: {exc}", file=sys.stderr)
        return 1
    no_call = [s for name in IRRELEVANCE_KINDS for s in scores[name]]
    # a high margin means "abstain"; a low pmi means "the tools do not explain it"
    sign = 1 if args.score == "margin" else -1
    signed = [sign * s for s in no_call], [sign * s for s in scores[CALL_SOURCE]]
    label = args.adapter or "base model"
    print(f"AUC, no-call requests above {CALL_SOURCE} ({args.score}, {label}): {auc(*signed):.3f}")
    print(f"{'threshold':>10} {'abstain':>9} {'refused':>9}")
    for threshold, kept, refused in thresholds(*signed):
        print(f"{sign * threshold:>+10.3f} {kept:>4}/{len(no_call):<4} {refused:>4}/{len(scores[CALL_SOURCE]):<4}")
    if args.json:
        Path(args.json).write_text(json.dumps({"score": args.score, "adapter": args.adapter, "scores": scores}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
