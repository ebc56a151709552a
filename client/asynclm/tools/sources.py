"""Where ``oven asynclm --tools`` finds a user's tools: Python files and MCP servers.

Each ``--tools`` value is one source; several (``--tools a.py --tools mcp:URL``) make one
registry, and two tools of one name are an error. ``demo`` and ``bfcl:KIND`` name whole
workloads with their own tools and tasks (``oven.client.asynclm.session``); they stand alone.
"""

from __future__ import annotations

import shlex

from contextlib import ExitStack

from .bfcl import KINDS
from .registry import Tool, ToolRegistry
from .user import load_tools_file

__all__ = ["FORMS", "is_user_source", "open_tools", "unknown_source"]

FORMS = (f"expected demo, bfcl:KIND (KIND one of {', '.join(KINDS)}), a tools file (FILE.py), mcp:URL or "
         "mcp-stdio:COMMAND")
MCP_URL, MCP_STDIO = "mcp:", "mcp-stdio:"


def unknown_source(spec: str) -> ValueError:
    return ValueError(f"--tools {spec!r}: {FORMS}")


def is_user_source(spec: str) -> bool:
    """Whether ``spec`` has the form of a source :func:`open_tools` opens (a file may still be missing)."""
    return spec.startswith((MCP_STDIO, MCP_URL)) or spec.endswith(".py")


def open_tools(specs: list[str], resources: ExitStack) -> ToolRegistry:
    """One registry of the tools of every source in ``specs``, in their order; MCP connections are
    entered into ``resources``, which keeps them open.

    Raises ValueError for a source of no known form, a bad tools file (see
    :func:`~.user.load_tools_file`) or a tool name given twice, and
    :class:`~.mcp_client.McpConnectError` for an MCP server that cannot be reached.
    """
    registry = ToolRegistry()
    for spec in specs:
        for tool in _source_tools(spec, resources):
            if tool.name in registry:
                raise ValueError(f"--tools {spec}: a tool called {tool.name!r} is already given by an earlier "
                                 "--tools")
            registry.register(tool)
    return registry


def _source_tools(spec: str, resources: ExitStack) -> list[Tool]:
    if spec.startswith(MCP_STDIO):
        try:
            command = shlex.split(spec.removeprefix(MCP_STDIO))
        except ValueError as e:
            raise ValueError(f"--tools {spec!r}: {e} (the command is split as a shell would)") from None
        if not command:
            raise ValueError(f"--tools {spec!r}: give the command that starts the server, as in "
                             "\"mcp-stdio:python my_server.py\"")
        return resources.enter_context(_mcp().stdio(command, spec)).tools
    if spec.startswith(MCP_URL):
        url = spec.removeprefix(MCP_URL)
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"--tools {spec!r}: an MCP server's URL starts with http:// or https://")
        return resources.enter_context(_mcp().url(url, spec)).tools
    if spec.endswith(".py"):
        return load_tools_file(spec)
    raise unknown_source(spec)


def _mcp():
    """The MCP client, imported only for an MCP source (the ``mcp`` package takes a second to import)."""
    try:
        from .mcp_client import McpConnection
    except ImportError as e:
        raise ValueError(f"MCP servers need the mcp package ({e}): pip install mcp") from None
    return McpConnection
