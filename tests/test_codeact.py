"""inferlets/codeact: its restricted evaluator (``sandbox.py``) against Python's own ``exec``/``eval`` on
what it allows, with a clear refusal of what it does not; and on SmolLM2, the observation fed back
for the code the model wrote is exactly the host's evaluation of that code, and every reply is what
greedy decoding of the context before it gives."""

from __future__ import annotations

import ast
import builtins
import importlib.util
import json
from pathlib import Path

import pytest
from harness import assert_pools_full, direct_greedy, messages, refused, run

from oven.control.tokenizer import Tokenizer

_spec = importlib.util.spec_from_file_location(
    "codeact_sandbox", Path(__file__).resolve().parents[1] / "inferlets" / "codeact" / "sandbox.py")
sandbox = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sandbox)

PROGRAMS = ["codeact"]
INFERENCE_MODEL = "smollm2-135m-instruct"
LOOP_CONFIG = dict(max_kv_pages_per_instance=64)
TASK = "What is 23 times 19, minus 4?"
MAX_TOKENS = 40


def python_result(source: str):
    """What Python itself makes of ``source``: every statement but the last run, then the last's value
    (an expression's, or the name an assignment bound); an exception as "TypeName: message"."""
    *body, last = ast.parse(source).body
    env = {"__builtins__": {name: getattr(builtins, name) for name in sandbox.FUNCTIONS}}
    try:
        exec(compile(ast.Module(body, []), "<code>", "exec"), env)
        if isinstance(last, ast.Expr):
            return eval(compile(ast.Expression(last.value), "<code>", "eval"), env)
        exec(compile(ast.Module([last], []), "<code>", "exec"), env)
        return env[(last.targets[0] if isinstance(last, ast.Assign) else last.target).id]
    except Exception as exc:  # noqa: BLE001 - the reference's error, compared as text
        return f"{type(exc).__name__}: {exc}"


def sandbox_result(source: str):
    try:
        return sandbox.evaluate(source)
    except sandbox.Failed as exc:
        return str(exc)


ALLOWED = [
    "1 + 2 * 3", "x = 12 * 7\nx + 5", "7 / 2", "7 // 2", "-7 // 2", "7 % 3", "-7 % 3", "7.5 % 2", "2 ** 10",
    "2 ** -2", "2 ** 0.5", "(1 + 2) * (3 - 4) / 5", "-(3)", "+4", "not 0", "not [1]", "1 < 2 < 3", "3 > 2 >= 2 != 1",
    "1 == 1.0", "[1, 2] == [1, 2]", "[1, 2] < [1, 3]", "0 or 5", "0 and 5", "3 and 0 or 7", "1 if 2 > 3 else 4",
    "xs = [3, 1, 2]\nxs[0] + xs[-1]", "min(4, 2, 9)", "max([4, 2, 9])", "abs(-3.5)", "round(2.675, 2)", "round(2.5)",
    "round(1234, -2)", "len([1, 2, 3])", "sum([1, 2.5, 3])", "sum([])", "x = 5", "x = 2\nx *= 3\nx += 1",
    "a = 1.5\nb = a * 4\nc = b ** 2\nc - a", "True + True", "10 ** 300 > 1e300", "0.1 + 0.2", "1e308 * 10",
    # Python's own errors, as Python words them
    "1 / 0", "7 % 0", "0 ** -1", "y + 1", "x += 1", "[1, 2][5]", "min([])", "1 < [1]", "len(5)", "sum(5)",
    "10.0 ** 400", "round(1e308 * 10)", "i = 1.5\n[1][i]", "x = 5\nx[0]", "abs([1])", "(10 ** 300) / (10 ** -300)",
]

REFUSED = {
    "import os": "import is not allowed",
    "from os import path": "import is not allowed",
    "x = 1\nx.real": "attribute access is not allowed",
    "().__class__": "attribute access is not allowed",
    "'a' * 10": "only numbers are allowed as constants, not str",
    "b'a'": "only numbers are allowed as constants, not bytes",
    "1j": "only numbers are allowed as constants, not complex",
    "None": "only numbers are allowed as constants, not NoneType",
    "open(0)": "calling open is not allowed (only abs, min, max, round, len, sum)",
    "__import__(0)": "calling __import__ is not allowed",
    "eval(1)": "calling eval is not allowed",
    "print(1)": "calling print is not allowed",
    "(lambda: 1)()": "calling an expression is not allowed",
    "lambda: 1": "lambda is not allowed",
    "[x for x in [1]]": "a comprehension is not allowed",
    "for i in [1]: i": "a for loop is not allowed",
    "while 1: 1": "a while loop is not allowed",
    "def f(): 1": "def is not allowed",
    "class A: 1": "class is not allowed",
    "if 1: 2": "an if statement is not allowed",
    "(x := 1)": "the := operator is not allowed",
    "{1: 2}": "a dict is not allowed",
    "(1, 2)": "a tuple is not allowed",
    "a, b = 1, 2": "an assignment binds one plain name",
    "a = b = 1": "an assignment binds one plain name",
    "[1, 2][0:1]": "a slice is not allowed",
    "max(1, 2, key=abs)": "max takes positional arguments only",
    "min(*[1, 2])": "*unpacking is not allowed",
    "1 << 2": "the operator LShift is not allowed",
    "5 & 3": "the operator BitAnd is not allowed",
    "~5": "the operator ~ is not allowed",
    "1 in [1]": "the comparison In is not allowed",
    "1 is 1": "the comparison Is is not allowed",
    "min = 3": "min can only be called",
    "f = max": "max can only be called",
    "f'{1}'": "an f-string is not allowed",
    "del x": "del is not allowed",
    "1 +": "the code does not parse: invalid syntax",
    "": "the code is empty",
    "1 + " * 500 + "1": "the code is longer than 2000 characters",
    "1" + " + 1" * 60: "the code is too big (at most 600 nodes, nested 40 deep)",
    "(" * 300 + "1" + ")" * 300: "the code",  # Python's parser or the depth cap: either refuses
}

CAPPED = {  # allowed code that would spend memory or time: stopped with a message, not run on
    "9 ** 9 ** 9": "the result would exceed 1024 bits",
    "2 ** 1025": "the result would exceed 1024 bits",
    "x = 2 ** 1000\nx * x": "the result would exceed 1024 bits",
    "1" * 400: "the result would exceed 1024 bits",
    "round(1.5, 1000000000)": "round keeps at most 100 digits either side of the point",
    "(-8) ** 0.5": "the result is not a real number",
    "a = [1]\n[a, a]": "a list holds numbers only, not a list",
    "[1] + [2]": "arithmetic takes numbers only, not a list",
    "[1] * 10 ** 9": "arithmetic takes numbers only, not a list",
}


@pytest.mark.parametrize("source", ALLOWED)
def test_the_sandbox_evaluates_as_python_does(source):
    expected, got = python_result(source), sandbox_result(source)
    assert (type(got), repr(got)) == (type(expected), repr(expected))


@pytest.mark.parametrize("source", REFUSED)
def test_what_the_sandbox_does_not_allow_is_refused_before_it_runs(source):
    with pytest.raises(sandbox.Refused) as refused:
        sandbox.evaluate(source)
    assert str(refused.value).startswith(REFUSED[source])


@pytest.mark.parametrize("source", CAPPED)
def test_sizes_are_capped(source):
    with pytest.raises(sandbox.Failed) as failed:
        sandbox.evaluate(source)
    assert str(failed.value) == CAPPED[source]


def host_observation(code: str) -> str:
    try:
        return repr(sandbox.evaluate(code))
    except sandbox.Refused as exc:
        return f"refused: {exc}"
    except sandbox.Failed as exc:
        return f"error: {exc}"


def test_the_observation_is_the_host_evaluation_of_the_code_the_model_wrote(loop, inference):
    (inst,) = run(loop, "codeact", [[TASK, "--turns", "3", "--max-tokens", str(MAX_TOKENS)]])
    assert inst.exit_code == 0, inst.error
    (report,) = map(json.loads, messages(loop, inst))
    tok, context, turns = Tokenizer(loop.info.tokenizer), report["context"], report["turns"]
    actions = [t for t in turns if t["code"] is not None]
    assert actions, turns  # the model wrote code at least once
    assert (actions[0]["code"], actions[0]["observation"], report["answer"]) == ("x = 23 * 19 - 4\n", "433", "433")
    for turn in turns:
        start = turn["start"]
        # the model's reply is greedy decoding of exactly the context before it
        assert turn["tokens"] == direct_greedy(inference, loop, context[:start], MAX_TOKENS)
    for turn in actions:
        assert tok.decode(turn["tokens"]).count("```") >= 2
        assert turn["code"] == turn["reply"].split("```python\n", 1)[1].split("```", 1)[0]
        assert turn["observation"] == host_observation(turn["code"])
        if not turn["observation"].startswith("refused:"):  # and Python's own, where the sandbox allows it
            expected = python_result(turn["code"])
            assert turn["observation"] == (f"error: {expected}" if isinstance(expected, str) else repr(expected))
        # what reaches the context: the reply up to its block's end, then the observation as a user turn
        following = next((t["start"] for t in turns if t["start"] > turn["start"]), len(context))
        fed = tok.decode(context[turn["start"]:following])
        assert fed.startswith(turn["reply"].rstrip())
        assert fed.endswith(f"```<|im_end|>\n<|im_start|>user\nObservation: {turn['observation']}<|im_end|>\n"
                            "<|im_start|>assistant\n")
    last = turns[-1]
    if "```" in last["reply"]:  # the turns ran out on an action
        assert report["answer"] is None and len(turns) == 3
    else:
        assert report["answer"] == last["reply"].split("Answer:", 1)[-1].strip()
    assert_pools_full(loop)


@pytest.mark.parametrize("args, error", [
    ([], "the following arguments are required: TASK"),
    (["a", "b"], "unrecognized arguments: b"),
    (["t", "--turns", "0"], "argument --turns: expected a whole number >= 1, not '0'"),
    (["t", "--max-tokens"], "argument --max-tokens: expected one argument"),
    (["t", "--x", "1"], "unrecognized arguments: --x 1"),
])
def test_bad_arguments_are_refused(loop, args, error):
    (stderr,) = refused(loop, "codeact", [args])
    assert stderr.startswith("usage: codeact [-h] [--turns N] [--max-tokens T] TASK")
    assert stderr.endswith(f"codeact: error: {error}\n")
