"""``oven asynclm --constrain`` (issue 43): the model's CML calls held to the tools' schemas by one grammar
(client/asynclm/tools/call_grammar.py), on the server for the inferlet and in process for the check
(client/asynclm/training/held.py).

The grammar is checked through llguidance on SmolLM2's own tokenizer, as the server reads it; then the
inferlet runs on SmolLM2 with the shipped adapter, on tools it was never trained on, behind `oven asynclm`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Literal

import jsonschema
import pytest
from harness import PROGRAM_DIR, Server

from oven.client.asynclm.tools import ToolRegistry, parse_call
from oven.client.asynclm.tools.call_grammar import call_grammar, registry_schemas
from oven.client.asynclm.tools.function_schema import function_tool
from oven.client.asynclm.tools.schema import schema_signature
from oven.client.asynclm.tools.user import load_tools_file
from oven.client.asynclm.training.held import HeldCalls, llg_tokenizer
from oven.client.openai_api.tools import calls_grammar
from oven.control.tokenizer import Tokenizer
from oven.inference.models import resolve_model
from oven.proto import grammar


def reserve_table(restaurant: str, guests: int, seating: Literal["indoor", "outdoor"] = "indoor") -> str:
    """Reserve a table."""
    return f"table for {guests} at {restaurant} ({seating})"


def mix(ratio: float, names: list[str], loud: bool = False) -> str:
    """Mix things."""
    return ""


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer(resolve_model("smollm2-135m-instruct").tokenizer)


@pytest.fixture(scope="module")
def registry() -> ToolRegistry:
    return ToolRegistry([function_tool(reserve_table, 100), function_tool(mix, 100)])


def accepts(text: str, lark: str, tokenizer: Tokenizer) -> bool:
    """Whether llguidance, as the server reads ``lark``, takes ``text`` (SmolLM2's tokens) as a whole."""
    llg = llg_tokenizer(tokenizer)
    compiled = grammar.grammar_text("lark", lark)
    grammar.check(compiled, llg)
    matcher, ids = grammar.matcher(compiled, llg), tokenizer.encode(text)
    if matcher.validate_tokens(ids) != len(ids):
        return False
    matcher.consume_tokens(ids)
    return matcher.is_accepting()


CALLS = [  # the text after a call's [HEAD], and whether the grammar takes it
    (' reserve_table(restaurant=" Nopa", guests=4, seating=" outdoor") [END]', True),
    (' reserve_table(restaurant=" Nopa", guests=4) [END]', True),  # an optional one left out
    (' reserve_table(restaurant="Nopa", guests=-2, seating="indoor") [END]', True),  # no opening space
    (' mix(ratio=0.5, names=[" a", "b"], loud=True) [END]', True),
    (" reserve_table(restaurant=' Nopa', guests=4, seating='outdoor') [END]", True),  # single quotes, as BFCL's
    (' reserve_table(restaurant=" Nopa\', guests=4) [END]', False),  # quotes that do not match
    (' mix(ratio=2, names=[]) [END]', True),  # an int is a number
    (' reserve_table(restaurant=" Nopa", guests=4, seating=" outdoor")', False),  # no [END]
    (' reserve_tables(restaurant=" Nopa", guests=4) [END]', False),  # an unknown function
    (' get_weather(city=" Paris") [END]', False),
    (' reserve_table(restaurant=" Nopa", people=4) [END]', False),  # an unknown argument
    (' reserve_table(restaurant=" Nopa", guests=" four") [END]', False),  # a string for an int
    (' reserve_table(restaurant=" Nopa", guests=4.5) [END]', False),  # a float for an int
    (' reserve_table(restaurant=4, guests=4) [END]', False),  # an int for a string
    (' reserve_table(restaurant=" Nopa", guests=4, seating=" roof") [END]', False),  # outside the enum
    (' reserve_table(guests=4) [END]', False),  # a required one missing
    (' reserve_table(restaurant=" Nopa", guests=4, guests=5) [END]', False),  # one twice
    (' mix(ratio=0.5, names=[1]) [END]', False),  # an array's items of the wrong type
    (' mix(ratio=0.5, names=[], loud=1) [END]', False),  # not a bool
    (' reserve_table(restaurant=" No[END]pa", guests=4) [END]', False),  # no delimiter inside a string
]


@pytest.mark.parametrize("text, taken", CALLS)
def test_the_call_grammar_holds_names_arguments_types_and_enums(text, taken, registry, tokenizer):
    assert accepts(text, call_grammar(registry_schemas(registry)), tokenizer) is taken


def test_arguments_in_the_schemas_order_or_the_signatures(tokenizer):
    """The prompt's signature puts required arguments first; BFCL's answers follow the schema's order:
    either is taken, each name once, the required ones present."""
    schema = {"name": "f", "parameters": {"type": "object", "required": ["b"], "properties": {
        "a": {"type": "integer"}, "b": {"type": "integer"}}}}
    lark = call_grammar([schema])
    forms = ("b=1", "b=1, a=2", "a=2, b=1", "a=2", "", "b=1, b=1")
    taken = [accepts(f" f({args}) [END]", lark, tokenizer) for args in forms]
    assert taken == [True, True, True, False, False, False]


def test_a_tool_without_a_schema_takes_any_literal_arguments(tokenizer):
    lark = call_grammar([{"name": "g", "parameters": None}])
    taken = [accepts(f" g({args}) [END]", lark, tokenizer) for args in ("", "1, x=[2]", 'y=" z"', "x=y")]
    assert taken == [True, True, True, False]


def test_openais_tool_choice_grammar_holds_calls_by_the_same_rules(registry, tokenizer):
    tools = tuple(registry_schemas(registry))
    line = '[CALL] t1 [HEAD] reserve_table(restaurant=" Nopa", guests=4) [END]\n[TRAP][END]'
    assert accepts(line, calls_grammar(tools), tokenizer)
    assert not accepts(line.replace("guests=4", "guests=four"), calls_grammar(tools), tokenizer)


def test_the_check_takes_the_likeliest_token_the_grammar_allows(registry, tokenizer):
    """held.py: the first of the ranked tokens the grammar allows; where none is, the first of all tokens
    ranked; the call's [END] closes it."""
    held = HeldCalls(registry, tokenizer)
    text = ' reserve_table(restaurant=" Nopa", guests=4) [END]'
    wanted = tokenizer.encode(text)
    refused = tokenizer.encode("\n")[0]  # nowhere in a call
    chosen = []
    for i, token in enumerate(wanted):
        ranked = [refused, token] if i % 2 else [refused]  # every other step: none of the ranked is allowed
        chosen.append(held.choose(ranked, lambda t=token: [refused, t]))
        assert held.open is (i + 1 < len(wanted))
    assert chosen == wanted


# -- end to end: `oven asynclm --constrain` on SmolLM2 and the shipped adapter --------------------------

ODD_TOOLS = '''\
"""Tools the shipped adapter never saw; asked about weather and money, it calls get_weather and
convert_currency, which are not among them."""
from typing import Literal


def reserve_table(restaurant: str, guests: int, seating: Literal["indoor", "outdoor"] = "indoor") -> str:
    """Reserve a table at a restaurant."""
    return f"table for {guests} at {restaurant} ({seating})"


def tide_level(harbor: str, hours_ahead: int = 0) -> float:
    """The sea level at a harbor in meters."""
    return 1.5 + hours_ahead / 10
'''


@pytest.fixture(scope="module")
def smollm2_server(tmp_path_factory):
    server = Server(tmp_path_factory.mktemp("constrain"), "--program-dir", PROGRAM_DIR, model="smollm2-135m-instruct")
    yield server
    server.stop()


def schema_violations(calls: list[str], registry: ToolRegistry) -> list[str]:
    """The calls that name no tool of ``registry`` or whose arguments its JSON schema does not validate."""
    bad = []
    for call in calls:
        parsed = parse_call(call)
        try:
            schema = registry.get(parsed.name).schema
            arguments = schema_signature(schema).bind(*parsed.args, **parsed.kwargs).arguments
            jsonschema.validate(dict(arguments), schema["parameters"])
        except (KeyError, TypeError, jsonschema.ValidationError):
            bad.append(call)
    return bad


def test_a_constrained_session_calls_only_the_tools_as_their_schemas_say(smollm2_server, tmp_path):
    (tmp_path / "odd_tools.py").write_text(ODD_TOOLS)
    registry = ToolRegistry(load_tools_file(tmp_path / "odd_tools.py"))
    # the check of the check: a call outside the registry, a wrong type, a value outside the enum
    wrong = ['get_weather(city=" Paris")', "tide_level(harbor=1)", 'reserve_table(restaurant="A", guests=2, seating="x")']
    assert schema_violations([*wrong, 'tide_level(harbor=" Brest")'], registry) == wrong
    env = {"OVEN_CONTROL_ENDPOINT": smollm2_server.endpoint,
           "OVEN_TOKEN": f"@{smollm2_server.state / 'operator.token'}"}
    proc = subprocess.run([sys.executable, "-m", "oven.client.cli", "asynclm", "--tools", "odd_tools.py", "--constrain",
                           "--max-tokens", "60", "What is the weather in Paris and what is 250 USD in EUR?"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=600, env={**os.environ, **env})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "calls held to the tools' schemas (--constrain)" in proc.stdout
    calls = re.findall(r"⇢ call (\w+): (.*)", proc.stdout)
    interrupts = dict(re.findall(r"⇠ interrupt (\w+): (.*)", proc.stdout))
    assert calls, proc.stdout
    assert schema_violations([call for _, call in calls], registry) == [], proc.stdout
    assert sorted(interrupts) == sorted(call_id for call_id, _ in calls)  # every call ran and came back
    assert not any(value.startswith("error") for value in interrupts.values()), proc.stdout
