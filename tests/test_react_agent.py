"""inferlets/react-agent: the ReAct loop's protocol with the client, and what reaches the context.

The tiny random model writes junk thoughts and malformed actions, so calls come from pinned
actions (the model still writes every thought) and the model's own actions test the error
path. The inferlet's --trace lists its whole context by writer. Every inferlet part must be
exactly the text the protocol prescribes, and every model token must be the most likely one
after exactly the context before it, with the same probability as one direct forward of the
whole context gives. Greedy tokens alone would prove little - this model repeats the last
token whatever came before - but the probabilities move when an observation changes.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from harness import assert_pools_full, events_of, messages, refused

from oven.control.tokenizer import Tokenizer
from oven.proto import inference as p

TOOLS = "calc(expression) evaluates arithmetic; search(query) looks a topic up"
QUESTION = "What is six times seven?"
TOKENS = 8
REL = 2e-5  # probabilities agree with a direct forward to this (float32 rounding: ~1e-6)


def drive(loop, instances, answer) -> None:
    """Run ``instances`` to their end, pushing ``answer(call)`` (messages) for every call each sends."""
    answered = {i.instance_id: 0 for i in instances}

    def unanswered():
        return [(i, c) for i in instances for c in calls_of(loop, i)[answered[i.instance_id]:]]

    while any(i.alive for i in instances):
        assert loop.run_until(lambda: not any(i.alive for i in instances) or unanswered(), 60)
        for inst, call in unanswered():
            answered[inst.instance_id] += 1
            for text in answer(call):
                inst.inbox.push(text)


def calls_of(loop, inst) -> list[dict]:
    return [m for m in map(json.loads, messages(loop, inst)) if m["type"] == "call"]


def final_of(loop, inst) -> dict:
    last = json.loads(messages(loop, inst)[-1])
    assert last["type"] == "final"
    return last


def result(call_id: str, value, ok: bool = True) -> str:
    return json.dumps({"type": "result", "id": call_id, "value": value, "ok": ok})


def most_likely_after_each(inference, loop, tokens: list[int]) -> list[tuple[int, float]]:
    """(token, probability) of the most likely next token after each prefix of ``tokens``: one
    forward straight on the inference process (nothing else may run meanwhile)."""
    page_size, num_pages = loop.info.page_size, -(-len(tokens) // loop.info.page_size)
    item = p.ForwardTextItem(tokens, list(range(len(tokens))), list(range(num_pages)),
                             len(tokens) - (num_pages - 1) * page_size, list(range(len(tokens))), top_k=1)
    with inference.client() as client:
        reply = client.call(p.ForwardTextRequest([item]))
    assert reply.errors[0] is None, reply.errors[0]
    return [(int(np.frombuffer(d.token_ids, "<i4")[0]), float(np.frombuffer(d.probs, "<f4")[0])) for d in reply.dists[0]]


def check_trace(inference, loop, trace: list, fills: list) -> list[str]:
    """The inferlet parts are ``fills`` in order (the prompt's end first; a callable gets the model's
    lines so far), plus a newline after each model line left open; the model parts are greedy, cut
    at a newline, an end token or TOKENS, with the direct forward's probabilities. The model's lines."""
    tok = Tokenizer(loop.info.tokenizer)
    end, fills, lines, at = tok.stop_token_ids, list(fills), [], 0
    expected = most_likely_after_each(inference, loop, [t for part in trace for t in part[1]])
    assert tok.decode(trace[0][1]).endswith(fills.pop(0))
    for (writer, tokens, *probs), previous in zip(trace[1:], trace):
        at += len(previous[1])
        if writer == "model":
            assert [(t, pytest.approx(pr, rel=REL)) for t, pr in zip(tokens, probs[0])] == expected[at - 1:at - 1 + len(tokens)]
            text = tok.decode([t for t in tokens if t not in end])
            assert len(tokens) == TOKENS or tokens[-1] in end or ("\n" in text and "\n" not in tok.decode(tokens[:-1]))
            lines.append(text.split("\n")[0].strip())
        elif previous[0] == "model" and "\n" not in tok.decode(previous[1]):
            assert tok.decode(tokens) == "\n"
        else:
            fill = fills.pop(0)
            assert tokens == tok.encode(fill(lines) if callable(fill) else fill)
    assert not fills
    return lines


PROGRAMS = ["react-agent"]  # stored in the module's ControlLoop (the `loop` fixture, conftest.py)


def malformed(action: str) -> str:
    return f"Observation: error: malformed action {action!r}; write name(arguments) or finish(answer)\n"


def test_calls_results_and_errors_reach_the_context(loop, inference):
    args = [QUESTION, "--tools", TOOLS, "--steps", "4", "--tokens", str(TOKENS), "--trace",
            "--pin", "calc(6*7)", "--pin", "search(oven)", "--pin", "calc("]
    finishing = [QUESTION, "--pin", "calc(6*7)", "--pin", "finish(42)", "--tokens", str(TOKENS)]
    agent, finisher = loop.launch("react-agent", args), loop.launch("react-agent", finishing)

    def answer(call):
        if call["id"] == "1":  # a stray result and a non-JSON message first: both ignored
            return [result("7", "stray"), "not json", result("1", "42")]
        return [result(call["id"], "no results", ok=False)]
    drive(loop, [agent, finisher], answer)
    assert agent.exit_code == 0 and finisher.exit_code == 0, (agent.error, finisher.error)

    assert calls_of(loop, agent) == [{"type": "call", "id": "1", "call": "calc(6*7)"},
                                     {"type": "call", "id": "2", "call": "search(oven)"}]
    final = final_of(loop, agent)
    assert (final["text"], final["steps"]) == (None, 4)  # the step budget, spent
    assert "".join(events_of(loop, agent, "stderr")).count("not the result of call 1") == 2
    lines = check_trace(inference, loop, final["trace"], [
        f"Tools: {TOOLS}\nQuestion: {QUESTION}\n",
        "Thought:", "Action:", " calc(6*7)\n", "Observation: 42\n",
        "Thought:", "Action:", " search(oven)\n", "Observation: error: no results\n",
        "Thought:", "Action:", " calc(\n", malformed("calc("),
        "Thought:", "Action:", lambda lines: malformed(lines[-1])])  # the model's own action: junk
    assert len(lines) == 5  # four thoughts and one action written by the model

    assert calls_of(loop, finisher) == [{"type": "call", "id": "1", "call": "calc(6*7)"}]
    assert final_of(loop, finisher) == {"type": "final", "text": "42", "steps": 2}
    assert_pools_full(loop)


def test_the_probabilities_check_sees_the_observation(loop, inference):
    """The check above has teeth: one digit of an observation moves every later probability by
    far more than REL (about 2e-3 relative on the tiny model)."""
    (agent,) = [loop.launch("react-agent", [QUESTION, "--steps", "2", "--tokens", "4", "--trace", "--pin", "calc(6*7)"])]
    drive(loop, [agent], lambda call: [result(call["id"], "42")])
    trace = final_of(loop, agent)["trace"]
    tok = Tokenizer(loop.info.tokenizer)
    at = next(i for i, part in enumerate(trace) if tok.decode(part[1]) == "Observation: 42\n")
    altered = [*trace[:at], ["inferlet", tok.encode("Observation: 41\n")], *trace[at + 1:]]
    assert len(altered[at][1]) == len(trace[at][1])
    honest = most_likely_after_each(inference, loop, [t for part in trace for t in part[1]])
    moved = most_likely_after_each(inference, loop, [t for part in altered for t in part[1]])
    start = sum(len(part[1]) for part in trace[:at + 1])
    later = [i for i in range(start, len(honest)) if trace_writer(trace, i + 1) == "model"]
    assert len(later) == 8  # the second step's thought and action, four tokens each
    for i in later:
        assert abs(moved[i][1] - honest[i][1]) > 20 * REL * honest[i][1]


def trace_writer(trace: list, position: int) -> str:
    for part in trace:
        if position < len(part[1]):
            return part[0]
        position -= len(part[1])
    return "none"


def test_bad_arguments_are_refused(loop):
    cases = [[], ["a", "b"], ["q", "--steps", "0"], ["q", "--pin"], ["q", "--depth", "2"]]
    errors = ["the following arguments are required: QUESTION", "unrecognized arguments: b",
              "argument --steps: expected a whole number >= 1, not '0'", "argument --pin: expected one argument",
              "unrecognized arguments: --depth 2"]
    for stderr, error in zip(refused(loop, "react-agent", cases), errors, strict=True):
        assert stderr.startswith("usage: react-agent [-h] [--tools DESCRIPTION] [--steps N]")
        assert stderr.endswith(f"react-agent: error: {error}\n")
    assert_pools_full(loop)
