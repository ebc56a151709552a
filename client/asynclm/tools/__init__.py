"""Client-side function calling: the tools an AsyncLM inferlet's calls run on.

The inferlet sends each call it emits as Python-syntax text; the client runs it
on a :class:`ToolExecutor` over a :class:`ToolRegistry` and sends the result back.
:func:`demo_registry` is a reproducible demo tool set; :func:`load_scenarios`
gives the BFCL workloads of the AsyncLM evaluation, with :func:`paper_latency`
emulating their execution times. The BFCL data need the ``bfcl-eval`` wheel, which
is read only when scenarios are loaded. A user's own tools, a Python file of functions
(:mod:`.user`) or MCP servers (:mod:`.mcp_client`), are opened by
:func:`.sources.open_tools`.
"""

from .bfcl import KINDS, Scenario, load_scenarios
from .call import ParsedCall, ToolError, format_call, parse_call, spaced_call
from .demo import demo_registry
from .executor import CallTiming, OnDone, ToolExecutor
from .latency import PaperLatency, paper_latency
from .registry import Tool, ToolRegistry

__all__ = [
    "KINDS",
    "Scenario",
    "load_scenarios",
    "ParsedCall",
    "ToolError",
    "format_call",
    "parse_call",
    "spaced_call",
    "demo_registry",
    "CallTiming",
    "OnDone",
    "ToolExecutor",
    "PaperLatency",
    "paper_latency",
    "Tool",
    "ToolRegistry",
]
