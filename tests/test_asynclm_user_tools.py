"""Users' own tools for ``oven asynclm``: a Python file of functions and an MCP server (client/asynclm/tools/
user.py, function_schema.py, docstring.py, mcp_client.py, sources.py, listing.py).

Schemas, results and errors are checked without a model; then each kind of source runs end to end: the
AsyncLM inferlet on a real ``oven serve`` (tiny model) with pinned calls, this test as its client through
``run_session``, and ``oven asynclm`` itself. The MCP server is a real one, written with the ``mcp``
package's MCPServer (FastMCP before mcp 2) and started by the client as a subprocess.
"""

from __future__ import annotations

import json
import os
import queue
import re
import socket
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import pytest
from harness import OVEN, Server

from oven.client.asynclm.session import run_session, session_spec, tools_workload
from oven.client.asynclm.tools import ToolError, ToolExecutor, ToolRegistry
from oven.client.asynclm.tools.docstring import parse_docstring
from oven.client.asynclm.tools.listing import tool_lines, tools_document
from oven.client.asynclm.tools.mcp_client import McpConnectError
from oven.client.asynclm.tools.sources import open_tools
from oven.client.asynclm.tools.user import load_tools_file
from oven.client.programs import library_program, upload_local

TOOLS_FILE = '''\
"""A user's tools: weather and arithmetic."""
from __future__ import annotations

import threading
from typing import Literal

from helper import scale  # a module beside the file, imported as `python FILE` would

LATENCY_MS = {"get_forecast": 400, "lookup": 500, "quick": 10}
released = threading.Event()  # the end-to-end test opens it


def get_forecast(city: str, days: int = 3, unit: Literal["celsius", "fahrenheit"] = "celsius") -> dict:
    """Daily forecast for a city,
    from the table.

    Not part of the description.

    Args:
        city: The city, e.g. "Paris".
        days (int): How many days,
            1 to 7.
        unit: The unit.

    Returns:
        The forecast.
    """
    return {"city": city, "highs": [scale(20)] * days, "unit": unit}


def tags_of(text: str, limit: float | None = None, tags: list[str] = [], strict: bool = False):
    """Tag a text.

    Parameters
    ----------
    text : str
        The text
        to tag.
    limit, strict
        Both explained here.
    """
    return ["tag:" + text]


async def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def fail(reason: str) -> str:
    """Always fails."""
    raise ValueError(reason)


def lookup(key: str) -> str:
    """A slow lookup: it answers once the test releases it."""
    if not released.wait(30):
        raise TimeoutError("never released")
    return f"value of {key}"


def quick(n: int) -> int:
    """Doubles n."""
    return 2 * n


def _helper():
    """Private: no tool."""


imported = scale  # a function the file imports is not its own
'''

MCP_SERVER = '''\
import sys
import time
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("oven-test")
GATE = Path(sys.argv[1])


@server.tool()
def echo_when_released(text: str) -> str:
    """Echo a text once the test releases it."""
    while not GATE.exists():
        time.sleep(0.01)
    return f"echo {text}"


@server.tool(name="add-numbers")
def add(a: int, b: int = 2) -> dict:
    """Add two integers.

    More about adding."""
    return {"sum": a + b}


@server.tool()
def refuse(reason: str) -> str:
    """Always refuses."""
    raise ToolError(reason)


if __name__ == "__main__":  # GATE [streamable-http PORT | sse PORT]
    if len(sys.argv) > 2:
        server.run(sys.argv[2], host="127.0.0.1", port=int(sys.argv[3]))
    else:
        server.run("stdio")
'''


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("user-tools")
    (root / "my_tools.py").write_text(TOOLS_FILE)
    (root / "helper.py").write_text("def scale(x):\n    return x + 1\n")
    (root / "mcp_server.py").write_text(MCP_SERVER)
    return root


@pytest.fixture
def tools_file(folder) -> Path:
    return folder / "my_tools.py"


def mcp_stdio(folder: Path, gate: Path) -> str:
    return f"mcp-stdio:{sys.executable} {folder / 'mcp_server.py'} {gate}"


# -- a tools file: schemas, results, errors ---------------------------------------------------------------

def test_a_tools_file_becomes_exact_schemas(tools_file):
    tools = load_tools_file(tools_file)
    assert [t.name for t in tools] == ["get_forecast", "tags_of", "add", "fail", "lookup", "quick"]
    schemas = {t.name: t.schema for t in tools}
    assert schemas["get_forecast"] == {
        "name": "get_forecast", "description": "Daily forecast for a city, from the table.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": 'The city, e.g. "Paris".'},
            "days": {"type": "integer", "description": "How many days, 1 to 7.", "default": 3},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "The unit.",
                     "default": "celsius"},
        }, "required": ["city"]}}
    assert schemas["tags_of"] == {
        "name": "tags_of", "description": "Tag a text.",
        "parameters": {"type": "object", "properties": {
            "text": {"type": "string", "description": "The text to tag."},
            "limit": {"type": "number", "description": "Both explained here.", "default": None},
            "tags": {"type": "array", "items": {"type": "string"}, "default": []},
            "strict": {"type": "boolean", "description": "Both explained here.", "default": False},
        }, "required": ["text"]}}
    assert schemas["add"]["parameters"] == {"type": "object", "required": ["a", "b"], "properties": {
        "a": {"type": "integer"}, "b": {"type": "integer"}}}
    assert ToolRegistry(tools).describe().splitlines()[:3] == [
        "- get_forecast(city: str, days: int = 3, unit: Literal['celsius', 'fahrenheit'] = 'celsius'): Daily "
        "forecast for a city, from the table. (estimated execution time: 400 ms)",
        "- tags_of(text: str, limit: float | None = None, tags: list[str] = [], strict: bool = False): Tag a text. "
        "(estimated execution time: 100 ms)",
        "- add(a: int, b: int): Add two integers. (estimated execution time: 100 ms)",
    ]


def test_a_docstring_section_ends_where_the_next_begins():
    doc = parse_docstring('''Summary line
        Args:
            x: first.
        Returns:
            y: not a parameter.
        ''')
    assert doc == parse_docstring("Summary line\n\nArgs:\n    x: first.\n\nReturns:\n    y: not a parameter.")
    assert (doc.summary, doc.arg_descriptions) == ("Summary line", {"x": "first."})
    numpy = parse_docstring("S.\n\nParameters\n----------\nx : int\n    one\nReturns\n-------\ny\n    two")
    assert numpy.arg_descriptions == {"x": "one"}
    assert parse_docstring(None).summary == ""


def test_the_users_functions_run_on_the_executor_and_return_their_text(tools_file):
    registry = ToolRegistry(load_tools_file(tools_file))
    results = queue.Queue()
    with ToolExecutor(registry, timeout_s=30) as executor:
        for call_id, text in [("c1", 'get_forecast(" Oslo", days=2)'), ("c2", "add(2, b=3)"),
                              ("c3", "tags_of('x')"), ("c4", "fail(reason='no way')"), ("c5", "quick(m=1)")]:
            executor.submit(call_id, text, lambda *answer: results.put(answer))
    answers = {call_id: (value, ok) for call_id, value, ok in (results.get() for _ in range(5))}
    assert answers == {
        "c1": ('{"city": "Oslo", "highs": [21, 21], "unit": "celsius"}', True),  # JSON for a dict
        "c2": ("5", True),  # str() of anything else; an async def ran to completion
        "c3": ('["tag:x"]', True),
        "c4": ("fail(reason='no way'): ValueError: no way", False),
        "c5": ("quick(m=1): wrong arguments: missing a required argument: 'n'", False),
    }


@pytest.mark.parametrize("source, message", [
    ("def f(x: int):\n    '''F.'''\n", None),  # (a good file, for contrast)
    ("x = 1\n", "{path}: defines no function (each public function of the file is a tool; names starting with "
                "_ are not)"),
    ("def f(:\n", "{path}:1: syntax error: invalid syntax"),
    ("import no_such_module_anywhere\n", "{path} does not import (line 1): ModuleNotFoundError: No module named "
                                         "'no_such_module_anywhere'"),
    ("def f(when: 'datetime.date'):\n    pass\nimport datetime\n",
     "{path}: f: parameter 'when': type datetime.date is no Python literal's (the model writes literals: use str, int, "
     "float, bool, list, tuple, dict, Literal[...], X | None, Any)"),
    ("def f(*names: str):\n    pass\n", "{path}: f: *names: a tool's parameters must each have a name"),
    ("def f(x: 'Nowhere'):\n    pass\n",
     "{path}: f: its type hints do not resolve: NameError: name 'Nowhere' is not defined"),
    ("def f():\n    pass\nLATENCY_MS = {'g': 5}\n", "{path}: LATENCY_MS names 'g', which is none of its tools (f)"),
    ("def f():\n    pass\nLATENCY_MS = {'f': -1}\n",
     "{path}: LATENCY_MS['f'] must be a number of milliseconds >= 0, not -1"),
])
def test_a_bad_tools_file_is_one_line_naming_it(tmp_path, source, message):
    path = tmp_path / "bad_tools.py"
    path.write_text(source)
    if message is None:
        assert [t.name for t in load_tools_file(path)] == ["f"]
        return
    with pytest.raises(ValueError) as info:
        load_tools_file(path)
    assert str(info.value) == message.format(path=path)


def oven_asynclm(*flags: str, cwd: Path, env: dict | None = None, timeout_s: float = 120):
    return subprocess.run([*OVEN, "asynclm", *flags], capture_output=True, text=True, cwd=cwd, timeout=timeout_s,
                          env={**os.environ, **(env or {})})


@pytest.mark.parametrize("flags, status, line", [
    (["--tools", "missing.py", "Hi"], 2, "oven: missing.py: no such file"),
    (["--tools", "my_tools.py", "--tools", "my_tools.py", "Hi"], 2,
     "oven: --tools my_tools.py: a tool called 'get_forecast' is already given by an earlier --tools"),
    (["--tools", "my_tools.py"], 2, "oven: give a TASK for your own tools (the demo task needs the demo tools)"),
    (["--tools", "my_tools.py", "--plan", "Hi"], 2,
     "oven: --plan pins the demo task's or a BFCL sample's calls; your own tools have none"),
    (["--tools", "my_tools.py", "--tools", "demo", "Hi"], 2,
     "oven: --tools my_tools.py --tools demo: demo and bfcl:KIND bring their own tools: give them alone"),
    (["--tools", "my_tools", "Hi"], 2, "oven: --tools 'my_tools': expected demo, bfcl:KIND (KIND one of parallel, "
                                       "live_parallel, multi_turn, multi_step_parallel), a tools file (FILE.py), "
                                       "mcp:URL or mcp-stdio:COMMAND"),
    (["--tools", "mcp-stdio:no-such-command-here", "Hi"], 1,
     "oven: --tools mcp-stdio:no-such-command-here: cannot connect: FileNotFoundError: [Errno 2] No such file or "
     "directory: 'no-such-command-here'"),
    (["--tools", "mcp:localhost:8000", "Hi"], 2,
     "oven: --tools 'mcp:localhost:8000': an MCP server's URL starts with http:// or https://"),
    (["--json"], 2, "oven: --json goes with --list-tools (a run prints its stream)"),
])
def test_bad_tools_are_one_line_and_a_status_before_any_server(folder, flags, status, line):
    proc = oven_asynclm(*flags, cwd=folder)
    assert (proc.returncode, proc.stderr.splitlines()[-1:], proc.stdout) == (status, [line], "")


def test_list_tools_prints_signatures_and_descriptions(folder):
    proc = oven_asynclm("--list-tools", "--tools", "my_tools.py", cwd=folder)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[:8] == [
        "get_forecast(city: str, days: int = 3, unit: Literal['celsius', 'fahrenheit'] = 'celsius')  [400 ms]",
        "    Daily forecast for a city, from the table.",
        '    city: The city, e.g. "Paris".',
        "    days: How many days, 1 to 7.",
        "    unit: The unit.",
        "tags_of(text: str, limit: float | None = None, tags: list[str] = [], strict: bool = False)  [100 ms]",
        "    Tag a text.",
        "    text: The text to tag.",
    ]
    listed = json.loads(oven_asynclm("--list-tools", "--json", cwd=folder).stdout)  # (the demo tools by default)
    assert [tool["name"] for tool in listed["tools"]] == ["get_weather", "get_stock_price", "search_web",
                                                          "calculate", "convert_currency", "get_time"]
    assert listed["tools"][0] == {
        "name": "get_weather", "signature": "get_weather(city: str)",
        "description": "Current weather for a city: temperature in Celsius, conditions and humidity.",
        "latency_ms": 300.0,
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


DOC = Path(__file__).resolve().parents[1] / "docs" / "asynclm.md"


@pytest.mark.parametrize("name, source", [("my_tools.py", "my_tools.py"),
                                          ("my_server.py", f"mcp-stdio:{sys.executable} my_server.py")])
def test_the_docs_examples_list_as_the_docs_show(tmp_path, name, source):
    """docs/asynclm.md's example file and MCP server, written out as they stand there, list what it shows."""
    text = DOC.read_text()
    code = re.search(rf'```python\n("""{re.escape(name)}:.*?)```', text, re.S)[1]
    (tmp_path / name).write_text(code)
    shown = re.search(rf"\$ oven asynclm --list-tools --tools (?:{re.escape(name)}|\"mcp-stdio:python {re.escape(name)}\")\n"
                      r"(.*?)(?:\$|```)", text, re.S)[1]
    proc = oven_asynclm("--list-tools", "--tools", source, cwd=tmp_path)
    assert (proc.returncode, proc.stdout) == (0, shown), proc.stderr


# -- an MCP server ----------------------------------------------------------------------------------------

def test_an_mcp_servers_tools_are_listed_and_called(folder, tmp_path):
    gate = tmp_path / "gate"
    gate.touch()  # (released from the start)
    with ExitStack() as resources:
        registry = open_tools([mcp_stdio(folder, gate)], resources)
        assert tools_document(registry)["tools"][1] == {
            "name": "add_numbers", "signature": "add_numbers(a: int, b: int = 2)", "description": "Add two integers.",
            "latency_ms": 100.0,
            "parameters": {"type": "object", "title": "addArguments", "required": ["a"], "properties": {
                "a": {"title": "A", "type": "integer"}, "b": {"default": 2, "title": "B", "type": "integer"}}}}
        assert tool_lines(registry) == [
            "echo_when_released(text: str)  [100 ms]", "    Echo a text once the test releases it.",
            "add_numbers(a: int, b: int = 2)  [100 ms]", "    Add two integers.",
            "refuse(reason: str)  [100 ms]", "    Always refuses.",
        ]
        assert registry.execute('echo_when_released(" hi")') == "echo hi"
        assert registry.execute("add_numbers(40, b=2)") == '{"sum": 42}'  # the server's JSON, on one line
        with pytest.raises(ToolError, match=r"^refuse\(reason='nope'\): McpToolError: Error executing tool "
                                            r"refuse: nope$"):
            registry.execute("refuse(reason='nope')")
        with pytest.raises(ToolError, match=r"^add_numbers\(b=1\): wrong arguments: missing a required argument: "
                                            r"'a'$"):
            registry.execute("add_numbers(b=1)")  # held to the schema before it reaches the server


@pytest.mark.parametrize("transport, path", [("streamable-http", "/mcp"), ("sse", "/sse")])
def test_an_mcp_server_over_http(folder, tmp_path, transport, path):
    with socket.socket() as probe:  # a free port (the server binds it a moment later)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    gate = tmp_path / "gate"
    gate.touch()
    process = subprocess.Popen([sys.executable, str(folder / "mcp_server.py"), str(gate), transport, str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not listening(port):
            assert process.poll() is None and time.monotonic() < deadline, "the MCP server did not come up"
            time.sleep(0.05)
        with ExitStack() as resources:
            registry = open_tools([f"mcp:http://127.0.0.1:{port}{path}"], resources)
            assert [tool.name for tool in registry] == ["echo_when_released", "add_numbers", "refuse"]
            assert registry.execute("add_numbers(a=2)") == '{"sum": 4}'
    finally:
        process.terminate()
        process.wait(30)


def listening(port: int) -> bool:
    with socket.socket() as connection:
        return connection.connect_ex(("127.0.0.1", port)) == 0


def test_an_mcp_server_that_is_no_server_is_one_line(folder):
    with pytest.raises(McpConnectError, match=r"^--tools mcp-stdio:.* cannot connect: MCPError: Connection "
                                              r"closed$"):
        open_tools([f"mcp-stdio:{sys.executable} -c pass"], ExitStack())


# -- end to end: the AsyncLM inferlet calls them, on a real server ---------------------------------------

@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`oven serve` on the tiny model, its store seeded with the compiled asynclm."""
    server = Server(tmp_path_factory.mktemp("user-tools-server"), programs=("asynclm",))
    yield server
    server.stop()


def run_pinned(server: Server, workload, plan: list[list[str]], release) -> tuple[list[dict], dict]:
    """The inferlet on ``workload`` with ``plan`` pinned, this process running its calls; ``release()`` is
    called when the second call is out (so the first can answer only once decoding wrote the second)."""
    workload.plan = plan
    spec = session_spec(workload, "async", kv="keep", max_tokens=8, answer_tokens=4)

    def on_event(event: dict) -> None:
        if event["type"] == "call" and event["id"] == "t2":
            release()
    with server.client() as client:
        program = upload_local(client, library_program("asynclm"), "asynclm")
        session = run_session(client, program, workload, spec, on_event, timeout_s=30)
    assert session.exit_code == 0, session.error
    return session.trace, session.summary


def calls_and_interrupts(trace: list[dict]) -> list[tuple[str, str, str]]:
    return [(e["type"], e["id"], e.get("call", e.get("value"))) for e in trace if e["type"] in ("call", "intr")]


def test_a_tools_files_functions_run_while_the_model_decodes(server, folder):
    with tools_workload([str(folder / "my_tools.py")], "Look up alpha and double 2.") as workload:
        released = workload.registry.get("lookup").function.__globals__["released"]
        trace, summary = run_pinned(server, workload, [["lookup(key='alpha')"], ["quick(n=2)"]], released.set)
    events = calls_and_interrupts(trace)
    # The longest first (LPT: 500 ms announced against 10), and the first's result only after the second
    # call was decoded: the call ran while the model went on.
    assert events[:2] == [("call", "t1", "lookup(key='alpha')"), ("call", "t2", "quick(n=2)")]
    assert sorted(events[2:]) == [("intr", "t1", "value of alpha"), ("intr", "t2", "4")]
    assert (summary["calls"], summary["interrupts"], summary["unanswered"]) == (2, 2, [])


def test_an_mcp_servers_tools_run_while_the_model_decodes(server, folder, tmp_path):
    gate = tmp_path / "gate"
    with tools_workload([mcp_stdio(folder, gate)], "Echo hi and add 1 and 2.") as workload:
        trace, summary = run_pinned(server, workload, [["echo_when_released(text='hi')"], ["add_numbers(a=1, b=2)"]],
                                    gate.touch)
    events = calls_and_interrupts(trace)
    assert events[:2] == [("call", "t1", "echo_when_released(text='hi')"), ("call", "t2", "add_numbers(a=1, b=2)")]
    assert sorted(events[2:]) == [("intr", "t1", "echo hi"), ("intr", "t2", '{"sum": 3}')]
    assert (summary["calls"], summary["interrupts"], summary["unanswered"]) == (2, 2, [])


def test_oven_asynclm_runs_on_a_file_and_an_mcp_server(server, folder, tmp_path):
    """The CLI's own path: both sources opened, the session run on the server, the MCP server ended after."""
    env = {"OVEN_CONTROL_ENDPOINT": server.endpoint, "OVEN_TOKEN": f"@{server.state / 'operator.token'}"}
    proc = oven_asynclm("--tools", "my_tools.py", "--tools", mcp_stdio(folder, tmp_path / "gate"), "--no-adapter",
                        "--max-tokens", "4", "What is 1 + 2?", cwd=folder, env=env, timeout_s=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("task: What is 1 + 2?\n(the model writes its calls; the base model (--no-adapter))")
    assert "\n--- tokens " in proc.stdout
