"""Client-side tools: call parsing, the registry, the concurrent executor, the demo
tools, BFCL workloads and the paper's latency model."""

from __future__ import annotations

import json
import queue
import re
import statistics
import threading

import pytest

from oven.client.asynclm.tools import (
    KINDS,
    ParsedCall,
    Tool,
    ToolError,
    ToolExecutor,
    ToolRegistry,
    demo_registry,
    format_call,
    load_scenarios,
    paper_latency,
    parse_call,
    spaced_call,
)
from oven.client.asynclm.tools.schema import SchemaStub, schema_tool_text

GUARD_S = 5.0  # only guards against a hang; no test asserts how long anything took


def _registry(*functions, latency_ms: float = 100) -> ToolRegistry:
    return ToolRegistry([Tool.from_function(f, latency_ms) for f in functions])


def add(a: int, b: int = 1) -> int:
    """Add two integers."""
    return a + b


def boom() -> None:
    """Always fails."""
    raise RuntimeError("kaput")


# --- call parsing and the registry -------------------------------------------------


def test_parse_call_positional_keyword_and_dotted():
    call = parse_call(" spotify.play('Taylor Swift', duration=20, tags=['a', (1, -2.5)]) ")
    assert call.name == "spotify.play"
    assert call.args == ("Taylor Swift",)
    assert call.kwargs == {"duration": 20, "tags": ["a", (1, -2.5)]}
    assert parse_call(format_call("f", {"x": {"k": [1, None]}, "y": True})).kwargs == {
        "x": {"k": [1, None]},
        "y": True,
    }


def test_spaced_string_arguments_read_as_the_written_values():
    # the trained form: a name after a space tokenises as in the question; the space is not the value
    assert spaced_call('get_weather(city="Zürich", days=2)') == 'get_weather(city=" Zürich", days=2)'
    assert parse_call('get_weather(city=" Zürich", days=2)') == parse_call('get_weather(city="Zürich", days=2)')
    written = "f('a', b=\"\", c=['x'], d=\"\"\"q\"\"\", e=\" kept\")"
    spaced = spaced_call(written)
    # plain literals gain one space, a list's strings and a triple-quoted string none
    assert spaced == "f(' a', b=\" \", c=['x'], d=\"\"\"q\"\"\", e=\"  kept\")"
    assert parse_call(spaced) == ParsedCall("f", ("a",), {"b": "", "c": ["x"], "d": "q", "e": " kept"})
    with pytest.raises(ToolError, match="not a literal value"):
        spaced_call("f(x=y)")


def test_registry_executes_good_calls():
    registry = _registry(add)
    assert registry.execute("add(2, 3)") == "5"
    assert registry.execute("add(a=2)") == "3"
    assert registry.execute("add(2, b=-7)") == "-5"


def test_registry_names_positional_arguments_by_the_signature():
    def tag(*labels: str) -> str:
        return ",".join(labels)

    def note(text: str, **extra) -> str:
        return text

    registry = _registry(add, tag, note)
    assert registry.named(parse_call("add(2, b=3)")) == ParsedCall("add", (), {"a": 2, "b": 3})
    assert registry.named(parse_call("add(2)")) == parse_call("add(a=2)")  # defaults are not filled in
    assert registry.named(parse_call("note('x', k=1)")) == ParsedCall("note", (), {"text": "x", "k": 1})
    # as written where there are no names to give: *args, arguments that do not bind, unknown tools
    for text in ("tag('a', 'b')", "add(1, 2, 3)", "add(1, a=2)", "other(1)"):
        assert registry.named(parse_call(text)) == parse_call(text)


def test_registry_results_are_json_for_dicts_and_lists():
    def pair(x: str) -> dict:
        return {"x": x, "items": [1, 2]}

    assert _registry(pair).execute("pair('é')") == '{"x": "é", "items": [1, 2]}'


@pytest.mark.parametrize(
    "call_text, message",
    [
        ("nope(1)", "nope(1): unknown function 'nope'"),
        ("os.system('x')", "os.system('x'): unknown function 'os.system'"),
        ("add(1", "add(1: syntax error: '(' was never closed"),
        ("add(1) + 1", "add(1) + 1: not a function call"),
        ("add", "add: not a function call"),
        ("add(1)(2)", "add(1)(2): the called function must be a plain name"),
        ("add(*[1, 2])", "add(*[1, 2]): *-unpacking is not allowed"),
        ("add(**{'a': 1})", "add(**{'a': 1}): **-unpacking is not allowed"),
        ("add(a=1, a=2)", "add(a=1, a=2): argument 'a' given twice"),
        ("add(1, 2, 3)", "add(1, 2, 3): wrong arguments: too many positional arguments"),
        ("add(c=1)", "add(c=1): wrong arguments: missing a required argument: 'a'"),
    ],
)
def test_registry_rejects_bad_calls_with_a_message_naming_the_call(call_text, message):
    with pytest.raises(ToolError, match=f"^{re.escape(message)}$"):
        _registry(add).execute(call_text)


@pytest.mark.parametrize(
    "call_text", ["f(os.system('x'))", "f(x=__import__('os'))", "f([1, y])", "f(1 if 2 else 3)"]
)
def test_non_literal_arguments_are_rejected_before_anything_runs(call_text):
    calls = []
    registry = ToolRegistry([Tool("f", lambda *a, **k: calls.append(a), "records", "f(x)", 1)])
    with pytest.raises(ToolError, match="is not a literal value"):
        registry.execute(call_text)
    assert calls == []


def test_an_exception_inside_a_tool_becomes_a_tool_error():
    with pytest.raises(ToolError, match=r"^boom\(\): RuntimeError: kaput$") as info:
        _registry(boom).execute("boom()")
    assert isinstance(info.value.__cause__, RuntimeError)


def test_describe_lists_signatures_and_estimated_times():
    assert _registry(add, latency_ms=250).describe() == (
        "- add(a: int, b: int = 1): Add two integers. (estimated execution time: 250 ms)"
    )


def test_registry_refuses_a_second_tool_of_one_name_and_reports_latency():
    registry = _registry(add, latency_ms=250)
    with pytest.raises(ValueError, match="already registered"):
        registry.register(Tool.from_function(add, 1))
    assert registry.latency_s("add(1)") == 0.25
    assert registry.latency_s("nope()") == 0.0
    assert registry.latency_s("add(") == 0.0


# --- the executor ------------------------------------------------------------------


class Collector:
    """An ``on_done`` that queues ``(call_id, value, ok)``."""

    def __init__(self):
        self.results: queue.Queue = queue.Queue()

    def __call__(self, call_id: str, value: str, ok: bool) -> None:
        self.results.put((call_id, value, ok))

    def take(self, n: int) -> dict[str, tuple[str, bool]]:
        items = [self.results.get(timeout=GUARD_S) for _ in range(n)]
        return {call_id: (value, ok) for call_id, value, ok in items}


def test_executor_runs_calls_concurrently():
    num_calls = 6
    done = Collector()
    with ToolExecutor(_registry(add), max_workers=num_calls, latency=lambda _: 0.2) as executor:
        for i in range(num_calls):
            executor.submit(f"c{i}", f"add({i})", done)
        results = done.take(num_calls)
        timings = executor.timings()
    assert results == {f"c{i}": (str(i + 1), True) for i in range(num_calls)}
    assert [t.call_id for t in timings] == [f"c{i}" for i in range(num_calls)]
    assert all(t.ok for t in timings)
    # Overlap: every call started before the first one finished.
    assert max(t.started_s for t in timings) < min(t.finished_s for t in timings)
    assert all(t.submitted_s <= t.started_s < t.finished_s for t in timings)


def test_executor_times_out_during_emulated_latency_and_frees_the_worker():
    done = Collector()
    with ToolExecutor(_registry(add), max_workers=1, timeout_s=0.1,
                      latency=lambda text: 60.0 if text == "add(1)" else 0.0) as executor:
        executor.submit("slow", "add(1)", done)
        executor.submit("next", "add(2)", done)
        results = done.take(2)
    # With one worker, "next" could only run because the timed-out call let go of it.
    assert results == {"slow": ("timeout after 0.1 s", False), "next": ("3", True)}


def test_a_hanging_tool_is_answered_once_with_a_timeout():
    release = threading.Event()

    def hang() -> str:
        """Blocks until released."""
        release.wait(GUARD_S)
        return "late"

    done = Collector()
    executor = ToolExecutor(_registry(hang), timeout_s=0.1)
    executor.submit("h", "hang()", done)
    assert done.take(1) == {"h": ("timeout after 0.1 s", False)}
    release.set()
    executor.close()
    assert done.results.empty()  # the late result is dropped
    (timing,) = executor.timings()
    assert timing.ok is False


def test_executor_failures_come_back_as_values():
    done = Collector()

    def broken_on_done(call_id: str, value: str, ok: bool) -> None:
        done(call_id, value, ok)
        raise ValueError("a caller bug must not kill the worker")

    with ToolExecutor(_registry(add, boom)) as executor:
        executor.submit("e", "boom()", broken_on_done)
        executor.submit("u", "nope()", broken_on_done)
        executor.submit("s", "add(os.system('x'))", broken_on_done)
        executor.submit("ok", "add(1)", broken_on_done)
        results = done.take(4)
    assert results == {
        "e": ("boom(): RuntimeError: kaput", False),
        "u": ("nope(): unknown function 'nope'", False),
        "s": ("add(os.system('x')): argument \"os.system('x')\" is not a literal value",
              False),
        "ok": ("2", True),
    }
    with pytest.raises(RuntimeError, match="after ToolExecutor.close"):
        executor.submit("late", "add(1)", done)


# --- the demo tools ----------------------------------------------------------------


DEMO_CALLS = [
    "get_weather(city='Paris')",
    "get_stock_price(symbol='AAPL')",
    "search_web(query='python asyncio')",
    "calculate(expression='2 * (3 + 4) ** 2 / 7')",
    "convert_currency(100, 'EUR', to_currency='USD')",
    "get_time(timezone='Asia/Kolkata')",
]


def test_demo_tools_are_deterministic():
    first, second = demo_registry(), demo_registry()
    assert [first.execute(c) for c in DEMO_CALLS] == [second.execute(c) for c in DEMO_CALLS]
    assert first.execute("calculate(expression='2 * (3 + 4) ** 2 / 7')") == "14.0"
    assert first.execute("calculate(expression='6991.9 * 3 / 3')") == "6991.9"  # 6991.899999999999 unrounded
    assert first.execute("calculate(expression='2 ** 0.5')") == "1.414213562"
    assert first.execute("calculate(expression='10 ** 20 / 3')") == "3.333333333e+19"
    assert first.execute("calculate(expression='7 // 2')") == "3"
    assert first.execute("convert_currency(100, 'EUR', to_currency='USD')") == (
        '{"amount": 108.0, "currency": "USD"}'
    )
    assert first.execute("get_time(timezone='Asia/Kolkata')") == "2025-06-01T17:30:00+05:30"
    assert json.loads(first.execute("get_weather(city='Paris')"))["city"] == "Paris"
    assert len(json.loads(first.execute("search_web(query='python asyncio')"))) == 3


def test_demo_tools_have_fixed_latencies_in_the_realistic_range():
    registry = demo_registry()
    assert len(registry) == 6
    assert all(100 <= tool.latency_ms <= 800 for tool in registry)
    assert registry.latency_s("search_web(query='x')") == 0.8


NOT_ARITHMETIC = {"__import__('os')": "\"__import__('os')\"", "x + 1": "'x'", "'a' * 3": "\"'a'\"",
                  "(1).real": "'1 .real'"}  # expression -> the part that is not arithmetic


@pytest.mark.parametrize("expression", [*NOT_ARITHMETIC, "9 ** 9 ** 9"])
def test_calculate_only_does_bounded_arithmetic(expression):
    why = f"not arithmetic: {NOT_ARITHMETIC[expression]}" if expression in NOT_ARITHMETIC else f"{expression} is too large"
    with pytest.raises(ToolError, match=f"ValueError: {re.escape(why)}$"):
        demo_registry().execute(format_call("calculate", {"expression": expression}))


# --- BFCL workloads ----------------------------------------------------------------


@pytest.fixture(scope="module")
def bfcl():
    pytest.importorskip("bfcl_eval")


NUM_SCENARIOS_BY_KIND = {"parallel": 200, "live_parallel": 16, "multi_turn": 200,
                         "multi_step_parallel": 200}


@pytest.mark.parametrize("kind", KINDS)
def test_bfcl_scenarios_load(bfcl, kind):
    scenarios = load_scenarios(kind)
    assert len(scenarios) == NUM_SCENARIOS_BY_KIND[kind]
    assert load_scenarios(kind, limit=3) == scenarios[:3]
    for scenario in scenarios:
        assert scenario.kind == kind and scenario.question and scenario.functions_text
        num_rounds = max((len(chain) for chain in scenario.chains), default=0)
        assert scenario.rounds == [
            [chain[k] for chain in scenario.chains if k < len(chain)] for k in range(num_rounds)
        ]
    if kind in ("parallel", "live_parallel"):
        assert all(len(s.rounds) == 1 and len(s.rounds[0]) >= 2 for s in scenarios)


@pytest.mark.parametrize("kind", KINDS)
def test_bfcl_ground_truth_executes_through_the_registry(bfcl, kind):
    for scenario in load_scenarios(kind, limit=5):
        registry = scenario.build_registry()
        for round_calls in scenario.rounds:
            for call_text in round_calls:
                result = registry.execute(call_text)  # raises ToolError on failure
                assert '"error":' not in result, (scenario.id, call_text, result)


def test_bfcl_multi_turn_runs_the_real_tool_classes(bfcl):
    (scenario,) = load_scenarios("multi_turn", limit=1)
    registry = scenario.build_registry()
    assert type(registry.get("cd").function.__wrapped__.__self__).__name__ == "GorillaFileSystem"
    assert type(registry.get("post_tweet").function.__wrapped__.__self__).__name__ == "TwitterAPI"
    with pytest.raises(ToolError, match="wrong arguments"):
        registry.execute("cd(directory='document')")  # checked against the real method
    assert "cp" not in registry  # the sample's excluded function
    assert registry.execute("cd(folder='document')") == '{"current_working_directory": "document"}'
    # State persists within a registry and a fresh one starts over.
    assert "final_report.pdf" in registry.execute("ls()")
    assert "document" in scenario.build_registry().execute("ls()")


def test_bfcl_parallel_functions_are_schema_stubs(bfcl):
    (scenario,) = load_scenarios("parallel", limit=1)
    assert scenario.rounds == [["spotify.play(artist='Taylor Swift', duration=20)",
                                "spotify.play(artist='Maroon 5', duration=15)"]]
    registry = scenario.build_registry()
    assert isinstance(registry.get("spotify.play").function, SchemaStub)
    result = json.loads(registry.execute(scenario.rounds[0][0]))
    assert result["arguments"] == {"artist": "Taylor Swift", "duration": 20}
    assert registry.execute(scenario.rounds[0][0]) == scenario.build_registry().execute(
        scenario.rounds[0][0])
    assert result != json.loads(registry.execute(scenario.rounds[0][1]))
    with pytest.raises(ToolError, match="missing a required argument: 'duration'"):
        registry.execute("spotify.play(artist='x')")
    with pytest.raises(ToolError, match="unexpected keyword argument 'volume'"):
        registry.execute("spotify.play(artist='x', duration=1, volume=3)")


def test_schema_text_puts_required_parameters_first():
    schema = {"name": "w", "description": "Weather.", "parameters": {"type": "dict",
              "properties": {"unit": {"type": "string", "default": "c"},
                             "city": {"type": "string"}}, "required": ["city"]}}
    assert schema_tool_text(schema) == ("w(city: str, unit: str = 'c')", "Weather.")


def test_bfcl_multi_step_parallel_is_deterministic_for_a_seed(bfcl):
    first = load_scenarios("multi_step_parallel", limit=20, seed=0)
    assert first == load_scenarios("multi_step_parallel", limit=20, seed=0)
    assert first != load_scenarios("multi_step_parallel", limit=20, seed=1)
    truth = {s.id: s for s in load_scenarios("multi_turn")}
    for scenario in first:
        assert len(scenario.chains) == 3 and len(set(scenario.source_ids)) == 3
        assert all(1 <= len(chain) <= 5 for chain in scenario.chains)
        assert len(scenario.rounds) == max(len(chain) for chain in scenario.chains)
        assert scenario.rounds[0] == [chain[0] for chain in scenario.chains]
        for chain, source_id in zip(scenario.chains, scenario.source_ids, strict=True):
            assert truth[source_id].chains[0][: len(chain)] == chain


def test_bfcl_prompt_times_are_the_paper_latencies(bfcl):
    (scenario,) = load_scenarios("parallel", limit=1, seed=7)
    latency_ms = paper_latency(7).function_ms("spotify.play")
    assert f"(estimated execution time: {latency_ms:.0f} ms)" in scenario.functions_text
    assert scenario.build_registry().latency_s("spotify.play(artist='x', duration=1)") == (
        latency_ms / 1000)


def test_paper_latency_bounds_and_mean():
    latency = paper_latency(seed=0)
    samples_ms = [latency.function_ms(f"function_{i}") for i in range(20_000)]
    assert min(samples_ms) >= 30.0 and max(samples_ms) <= 500.0
    assert abs(statistics.mean(samples_ms) - 110.0) < 2.0
    assert statistics.median(samples_ms) < 100.0  # right-skewed, like service latencies
    assert latency("function_3(x=1)") == latency.function_ms("function_3") / 1000
    assert paper_latency(seed=0).function_ms("function_3") == samples_ms[3]
    assert paper_latency(seed=1).function_ms("function_3") != samples_ms[3]
    assert latency("not a call(") == 0.0


def test_executor_runs_a_multi_step_parallel_scenario_round_by_round(bfcl):
    (scenario,) = load_scenarios("multi_step_parallel", limit=1)
    done = Collector()
    with ToolExecutor(scenario.build_registry()) as executor:
        for k, round_calls in enumerate(scenario.rounds):
            for i, call_text in enumerate(round_calls):
                executor.submit(f"r{k}c{i}", call_text, done)
            results = done.take(len(round_calls))  # a round waits for the previous one
            assert all(ok for _, ok in results.values()), results
    assert len(executor.timings()) == scenario.num_calls
