"""Pipelined ``generate`` (sdk/python/inferlet/pipelined.py, sdk/rust/oven/src/context/pipelined.rs)
against the step-by-step loop of the same SDK, inside real inferlets on the tiny model: the same
text and tokens, and the context left in the same state (tokens, pending token, pages, the sampler's
generator, what it decodes next), for Greedy and a seeded TopP, stopped by max tokens, an end token
and a stop string; and the two SDKs' reports equal."""

from __future__ import annotations

import json

import pytest
from harness import assert_pools_full, messages, run
from oven.control.tokenizer import Tokenizer

PROGRAMS = ["conformance", "conformance-rust"]  # stored in the module's ControlLoop (conftest.py)
PROMPT = "Once upon a time, in a land far away, there lived a"
SAMPLERS = ["greedy", "top_p:0.9:1.3:6"]


def pipelined(loop, spec: str, max_tokens: int, *options: str) -> dict:
    """The Python SDK's report (the Rust SDK's must be equal: both paths of both SDKs)."""
    args = ["|".join(["pipelined", spec, PROMPT, str(max_tokens), *options])]
    reports = []
    for program in PROGRAMS:
        (inst,) = run(loop, program, [args])
        assert inst.exit_code == 0, inst.error
        (report,) = [json.loads(m) for m in messages(loop, inst)]
        reports.append(report)
    assert reports[0] == reports[1]
    return reports[0]


def assert_same(report: dict) -> None:
    assert report["pipelined"] == report["stepwise"]


@pytest.fixture(scope="module")
def free_runs(loop):
    """Each sampler's 40 tokens with no stop but the budget: the stops below are picked inside them."""
    return {spec: pipelined(loop, spec, 40, "noeos") for spec in SAMPLERS}


@pytest.mark.parametrize("spec", SAMPLERS)
def test_stopped_by_max_tokens(loop, free_runs, spec):
    report = free_runs[spec]
    assert_same(report)
    assert len(report["pipelined"]["generated"]) == 40
    assert_pools_full(loop)
    # It did run pipelined: a step and the one ahead of it held two slots at once; none is left.
    assert loop.replicas[0].calls.token_slots.high_water >= 2 and len(loop.replicas[0].calls.token_slots) == 0


@pytest.mark.parametrize("spec", SAMPLERS)
@pytest.mark.parametrize("at", [0, 7, 16])  # the first token; mid-page; where a page boundary falls
def test_stopped_by_an_end_token(loop, free_runs, spec, at):
    generated = free_runs[spec]["pipelined"]["generated"]
    token = generated[at]
    report = pipelined(loop, spec, 40, f"token={token}", "noeos")
    assert_same(report)
    assert report["pipelined"]["generated"] == generated[:generated.index(token) + 1]


@pytest.mark.parametrize("spec", SAMPLERS)
def test_stopped_by_a_stop_string(loop, free_runs, spec):
    tokenizer = Tokenizer(loop.info.tokenizer)
    generated = free_runs[spec]["pipelined"]["generated"]
    text = tokenizer.decode(generated)
    needle = tokenizer.decode(generated[10:12]).strip()[:3]
    assert needle and needle in text
    report = pipelined(loop, spec, 40, f"string={needle}", "noeos")
    assert_same(report)
    assert report["pipelined"]["text"] == text[:text.index(needle)]
    assert len(report["pipelined"]["generated"]) < 40


def test_a_sampler_with_a_budget_of_nothing_generates_nothing(loop):
    report = pipelined(loop, SAMPLERS[1], 0)
    assert_same(report)
    assert report["pipelined"]["generated"] == []
