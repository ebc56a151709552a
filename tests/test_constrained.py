"""Constrained generation through a real inferlet (``inferlets/constrained``, Python SDK) on SmolLM2:
JSON Schema, regex, Lark and choice outputs are in their grammar's language, pipelined decode and
all; log-probabilities come back per token; bad grammars are one clear error at creation and hurt
no other instance."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from harness import control_loop, events_of, messages, refused, run, tiny_inference

PROGRAMS = ["constrained"]
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 16},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}


@pytest.fixture(scope="module")
def loop():
    with tiny_inference(model="smollm2-135m-instruct", num_kv_pages=256) as process:
        with control_loop(process, None, PROGRAMS) as control:
            yield control


def test_outputs_are_in_their_grammars_language(loop):
    cases = [["json-schema", json.dumps(PERSON), "Describe a person as JSON.", "96", "--chat"],
             ["regex", r"\d{3}-\d{4}", "Call me at", "16"],
             ["choice", json.dumps(["yes", "no", "maybe later"]), "Is the sky green?", "8", "--chat"],
             ["lark", 'start: "(" NUMBER ("," NUMBER)* ")"\nNUMBER: /[0-9]+/', "A tuple of three numbers:", "24"],
             ["json-schema", json.dumps(PERSON), "A person:", "96", "--temperature", "1.0", "--seed", "7"]]
    instances = run(loop, "constrained", cases)
    for case, inst in zip(cases, instances):
        assert inst.exit_code == 0, (case, inst.error)
        out = messages(loop, inst)
        assert out[-1] != "stopped: max_tokens", (case, out)
        text = out[0]
        if case[0] == "json-schema":
            jsonschema.validate(json.loads(text), PERSON)
        elif case[0] == "regex":
            assert re.fullmatch(r"\d{3}-\d{4}", text), text
        elif case[0] == "choice":
            assert text in ("yes", "no", "maybe later")
        else:
            assert re.fullmatch(r"\(\d+(,\d+)*\)", text), text


def test_logprobs_come_with_each_token(loop):
    (inst,) = run(loop, "constrained", [["choice", json.dumps(["red", "green", "blue"]), "My favourite colour is",
                                          "8", "--logprobs", "3"]])
    text, table = messages(loop, inst)[:2]
    rows = json.loads(table)
    assert rows and all(len(top) == 3 and lp <= 0 for _, lp, top in rows)
    assert text in ("red", "green", "blue")


@pytest.mark.parametrize("kind,spec,error", [
    ("lark", 'start: "a" (', "lark: "),
    ("regex", "(", "regex: "),
    ("json-schema", "{not json", "json-schema is not JSON"),
    ("choice", "[]", "choice must be a non-empty JSON array"),
    ("json-schema", json.dumps({"enum": [f"value-{i}" for i in range(100_000)]}), "json-schema: "),
    ("json-schema", '{"type": "object", "properties": {"a": ' * 200 + "{}" + "}}" * 200, "json-schema: "),
    ("json-schema", "[" * 100_000 + "]" * 100_000, "json-schema is nested too deeply"),
    ("lark", "start: " + " | ".join(f'"{i}"' for i in range(300_000)), "past the limit of 1 MiB"),
])
def test_a_bad_grammar_is_one_clear_error_at_creation(loop, kind, spec, error):
    (inst,) = run(loop, "constrained", [[kind, spec, "Hi", "4"]])
    assert inst.exit_code != 0
    assert error in inst.error and "\n" not in inst.error, inst.error


@pytest.mark.parametrize("args, error", [
    ([], "the following arguments are required: KIND, SPEC, PROMPT"),
    (["xml", "<a/>", "Hi", "4"], "argument KIND: invalid choice: 'xml' (choose from json-schema, regex, lark, choice)"),
])
def test_bad_arguments_are_refused(loop, args, error):
    (stderr,) = refused(loop, "constrained", [args])
    assert stderr.startswith("usage: constrained [-h] [--chat]") and stderr.endswith(f"constrained: error: {error}\n")
