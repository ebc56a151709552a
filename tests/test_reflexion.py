"""inferlets/reflexion against a sequential reference driven from here, on SmolLM2.

The reference rebuilds every context from the documented pieces (each encoded on its own): the
question, the reflections so far, the answer cue; then the attempt, the feedback, the reflection cue.
Each attempt and reflection must be what greedy decoding of its context from scratch in the inference
process gives (fresh contexts: no forks, no shared memory pages). The trials must stop exactly at the
first that passes: a checker that only the second attempt satisfies stops after two, with the same
two trials as a run that never passes.
"""

from __future__ import annotations

import json
import re

import pytest
from harness import assert_pools_full, direct_greedy, messages, refused, run
from oven.control.tokenizer import Tokenizer

QUESTION = "Name a fruit that is yellow."
MAX_TOKENS, REFLECTION_TOKENS, TRIALS = 10, 10, 3
NEVER = "no attempt writes this"
MODEL = "smollm2-135m-instruct"  # the tiny model's random weights write the same junk whatever the memory holds
INFERENCE_MODEL = MODEL
PROGRAMS = ["reflexion"]
LOOP_CONFIG = dict(max_kv_pages_per_instance=64)


def reflexion(loop, *checker: str, trials: int = TRIALS) -> dict:
    args = [QUESTION, *checker, "--trials", str(trials), "--max-tokens", str(MAX_TOKENS),
            "--reflection-tokens", str(REFLECTION_TOKENS)]
    (inst,) = run(loop, "reflexion", [args])
    assert inst.exit_code == 0, inst.error
    (message,) = messages(loop, inst)
    return json.loads(message)


def host_reference(loop, inference, passes, trials: int) -> list[dict]:
    """The trials driven one call at a time from here, each context from scratch."""
    tok = Tokenizer(loop.info.tokenizer)

    def body(tokens):
        return tokens[:-1] if tokens and tokens[-1] in tok.stop_token_ids else tokens

    def text(tokens):
        return tok.decode([t for t in tokens if t not in tok.stop_token_ids])

    memory, out = tok.encode(f"Question: {QUESTION}\n"), []
    for t in range(1, trials + 1):
        context = memory + tok.encode("Answer:")
        tokens = direct_greedy(inference, loop, context, MAX_TOKENS)
        out.append({"context": context, "tokens": tokens, "text": text(tokens), "passed": passes(text(tokens)),
                    "reflection": None})
        if out[-1]["passed"]:
            break
        if t < trials:
            at = context + body(tokens) + tok.encode("\nFeedback: the answer is wrong.\nReflection:")
            lesson = direct_greedy(inference, loop, at, REFLECTION_TOKENS)
            out[-1]["reflection"] = {"context": at, "tokens": lesson, "text": text(lesson)}
            memory = memory + tok.encode(f"Reflection {t}:") + body(lesson) + tok.encode("\n")
    return out


@pytest.fixture(scope="module")
def never(loop):
    return reflexion(loop, "--expect", NEVER)


def test_every_trial_and_reflection_equals_the_host_driven_reference(loop, inference, never):
    want = host_reference(loop, inference, lambda text: NEVER in text, TRIALS)
    assert never["trials"] == want
    assert (never["passed"], never["answer"]) == (False, None)
    assert [t["reflection"] is None for t in never["trials"]] == [False] * (TRIALS - 1) + [True]
    # the reflections in memory change what the model answers
    assert len({t["text"] for t in never["trials"]}) == TRIALS, [t["text"] for t in never["trials"]]
    assert_pools_full(loop)


def test_the_trials_stop_exactly_at_the_first_that_passes(loop, inference, never):
    first, second = never["trials"][0]["text"], never["trials"][1]["text"]
    words = [w for w in re.findall(r"\w{3,}", second) if w not in first]
    assert words, f"the second attempt has no word the first lacks: {first!r}, {second!r}"
    report = reflexion(loop, "--expect", words[0])
    assert [t["passed"] for t in report["trials"]] == [False, True]
    want = [dict(t) for t in never["trials"][:2]]
    want[1].update(passed=True, reflection=None)  # the passing trial is not reflected on
    assert report["trials"] == want
    assert report["trials"] == host_reference(loop, inference, lambda text: words[0] in text, TRIALS)
    assert (report["passed"], report["answer"]) == (True, second)
    # a pattern that the first attempt already matches: one trial, no reflection
    report = reflexion(loop, "--pattern", re.escape(first[-4:]) + "$")
    assert [(t["passed"], t["reflection"]) for t in report["trials"]] == [(True, None)]
    assert (report["answer"], report["trials"][0]["tokens"]) == (first, never["trials"][0]["tokens"])
    assert_pools_full(loop)


def test_one_trial_is_never_reflected_on(loop, never):
    report = reflexion(loop, "--expect", NEVER, trials=1)
    assert report["trials"] == [{**never["trials"][0], "reflection": None}]
    assert (report["passed"], report["answer"]) == (False, None)


@pytest.mark.parametrize("args, error", [
    (["q"], "one of the arguments --expect --pattern is required"),
    (["q", "--expect", "a", "--pattern", "b"], "argument --pattern: not allowed with argument --expect"),
    (["q", "--expect", ""], "argument --expect: must not be empty"),
    (["q", "--pattern", "("], "argument --pattern: not a regular expression: missing ), unterminated subpattern at position 0"),
    (["q", "--expect", "a", "--trials", "0"], "argument --trials: expected a whole number >= 1, not '0'"),
    (["--expect", "a"], "the following arguments are required: QUESTION"),
    (["q", "--expect"], "argument --expect: expected one argument"),
    (["q", "--expect", "a", "--memory", "1"], "unrecognized arguments: --memory 1"),
])
def test_bad_arguments_are_refused(loop, args, error):
    (stderr,) = refused(loop, "reflexion", [args])
    assert stderr.startswith("usage: reflexion [-h] (--expect TEXT | --pattern REGEX) [--trials N]")
    assert stderr.endswith(f"reflexion: error: {error}\n")
