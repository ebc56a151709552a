"""Every schema of tests/schemas.py through the Python SDK (``inferlets/constrained`` on SmolLM2, greedy,
pipelined): each output parses and validates, formats included. Every fourth of them goes through the
``openai`` client in test_openai_shaping.py."""

from __future__ import annotations

import json

import jsonschema
import pytest
from harness import control_loop, messages, run, tiny_inference
from schemas import FORMAT_CHECKER, SCHEMAS

PROGRAMS = ["constrained"]
MAX_TOKENS = 320  # the longest (recipe: emoji strings at their maxLength, several tokens each) takes ~250


@pytest.fixture(scope="module")
def loop():
    with tiny_inference(model="smollm2-135m-instruct", num_kv_pages=1024) as process:
        with control_loop(process, None, PROGRAMS, max_kv_pages_per_instance=64) as control:
            yield control


def test_every_schema_gives_output_that_validates(loop):
    assert len(SCHEMAS) >= 50
    cases = [["json-schema", json.dumps(schema), f"Write {name.replace('_', ' ')} as JSON.", str(MAX_TOKENS), "--chat"]
             for name, schema in SCHEMAS]
    instances = run(loop, "constrained", cases, timeout_s=600)
    failures = []
    for (name, schema), inst in zip(SCHEMAS, instances):
        out = messages(loop, inst)
        if inst.exit_code != 0 or out[-1] == "stopped: max_tokens":
            failures.append((name, inst.error, out[-1:]))
            continue
        try:
            jsonschema.validate(json.loads(out[0]), schema, format_checker=FORMAT_CHECKER)
        except (ValueError, jsonschema.ValidationError) as exc:
            failures.append((name, out[0], str(exc)[:200]))
    assert not failures, failures
