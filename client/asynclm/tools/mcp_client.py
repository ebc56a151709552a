"""An MCP server's tools (``--tools mcp:URL``, ``--tools "mcp-stdio:COMMAND ARGS"``), through the
``mcp`` package's client.

:class:`McpConnection` holds one client session open on a thread of its own that runs its
event loop: the executor's worker threads call tools through it (:meth:`McpConnection.call`
blocks its worker only) and many calls are in flight at once. Each tool the server lists
becomes a :class:`~.registry.Tool` whose schema is the server's JSON schema; the model calls it
in Python syntax like any other, and the registry checks the call's arguments against the
schema's names before it reaches the server. A result's text blocks, joined by newlines, are the
interrupt's text; a result the server marks as an error is an error result.

A tool name that is no Python name (``get-weather``) is offered to the model as one
(``get_weather``) and called by its own.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import json
import logging
import re
import sys
import threading

from collections.abc import Callable
from typing import Any

from mcp import Client
from mcp.client.sse import sse_client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from .docstring import parse_docstring
from .registry import DEFAULT_LATENCY_MS, Tool
from .schema import schema_signature, schema_tool_text

__all__ = ["McpConnection", "McpConnectError", "McpToolError"]

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 60.0  # a stdio server's start (an interpreter, its imports) and the handshake
# A worker gives up on a call the server never answers after as long as a session's executor waits (its
# timeout answers the model first), so that the executor's close at the session's end is not held longer.
CALL_TIMEOUT_S = 60.0
_NOT_A_NAME = re.compile(r"\W")


class McpConnectError(RuntimeError):
    """The server could not be started, reached or listed; the message says which and why."""


class McpToolError(RuntimeError):
    """The server ran the call and reported an error (its text is the message)."""


class McpConnection:
    """One MCP server: connected by :meth:`open` (or ``with``), its tools in :attr:`tools`.

    ``source`` names the server in messages (the ``--tools`` text); ``transport`` makes the
    ``mcp`` transport (a stdio subprocess, an HTTP session) in the connection's event loop.
    """

    def __init__(self, source: str, transport: Callable[[], Any]):
        self.source = source
        self.tools: list[Tool] = []
        self._transport = transport
        self._client: Client | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._main: asyncio.Task | None = None
        self._listed: concurrent.futures.Future[list] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._serve, daemon=True, name=f"mcp {source}")

    @classmethod
    def stdio(cls, command: list[str], source: str) -> McpConnection:
        """A server started as ``command`` (a subprocess that speaks MCP on its stdin and stdout;
        its stderr is this process's)."""
        parameters = StdioServerParameters(command=command[0], args=command[1:])
        return cls(source, lambda: stdio_client(parameters, errlog=sys.stderr))

    @classmethod
    def url(cls, url: str, source: str) -> McpConnection:
        """A server at ``url``: streamable HTTP, or the older SSE transport where the path ends in ``/sse``."""
        sse = url.split("?", 1)[0].rstrip("/").endswith("/sse")
        return cls(source, lambda: sse_client(url) if sse else streamable_http_client(url))

    def __enter__(self) -> McpConnection:
        return self.open()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def open(self) -> McpConnection:
        """Connect and list the server's tools. Raises :class:`McpConnectError` in one line."""
        self._thread.start()
        try:
            listed = self._listed.result(timeout=CONNECT_TIMEOUT_S)
        except concurrent.futures.TimeoutError:
            self.close()
            raise McpConnectError(f"--tools {self.source}: no answer within {CONNECT_TIMEOUT_S:.0f} s") from None
        except Exception as e:
            self.close()
            raise McpConnectError(f"--tools {self.source}: cannot connect: {_reason(e)}") from None
        self.tools = self._registry_tools(listed)
        if not self.tools:
            self.close()
            raise McpConnectError(f"--tools {self.source}: the server offers no tools")
        return self

    def call(self, name: str, arguments: dict[str, Any]) -> str:
        """Call tool ``name`` (the server's own name) and wait for its text; raises
        :class:`McpToolError` for an error result, or what the client raised."""
        if self._loop is None or self._client is None:
            raise RuntimeError(f"{self.source} is not connected")
        future = asyncio.run_coroutine_threadsafe(self._client.call_tool(name, arguments), self._loop)
        try:
            result = future.result(timeout=CALL_TIMEOUT_S)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise
        return result_text(result)

    def close(self) -> None:
        """End the session (a stdio server's process with it); calls in flight fail."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(self._end)
            except RuntimeError:  # the loop closed meanwhile
                pass
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _end(self) -> None:
        if self._listed.done() and self._stop is not None:
            self._stop.set()  # leave the session as it was entered: the transport closes cleanly
        elif self._main is not None:
            self._main.cancel()  # still connecting

    def _serve(self) -> None:
        try:
            asyncio.run(self._session())
        except BaseException as e:  # noqa: BLE001 (reported to open(), or logged: nothing else would see it)
            if not self._listed.done():
                self._listed.set_exception(e if isinstance(e, Exception) else RuntimeError(repr(e)))
            elif not isinstance(e, asyncio.CancelledError):
                log.warning("%s: the MCP session ended: %s", self.source, _reason(e))

    async def _session(self) -> None:
        self._loop, self._stop, self._main = asyncio.get_running_loop(), asyncio.Event(), asyncio.current_task()
        async with Client(self._transport()) as client:
            listed, cursor = [], None
            while True:
                page = await client.list_tools(cursor=cursor)
                listed.extend(page.tools)
                cursor = page.next_cursor
                if cursor is None:
                    break
            self._client = client
            self._listed.set_result(listed)
            await self._stop.wait()

    def _registry_tools(self, listed: list) -> list[Tool]:
        tools, names = [], set()
        for listed_tool in listed:
            schema = {"name": _python_name(listed_tool.name), "description": listed_tool.description or "",
                      "parameters": listed_tool.input_schema}
            try:
                signature = schema_signature(schema)
            except (ValueError, TypeError) as e:  # a parameter name no call could write
                log.warning("%s: tool %r left out: %s", self.source, listed_tool.name, e)
                continue
            if schema["name"] in names:
                raise McpConnectError(f"--tools {self.source}: two tools are both called {schema['name']!r} "
                                      "as Python names")
            names.add(schema["name"])
            signature_text, _ = schema_tool_text(schema)
            function = _McpFunction(self, listed_tool.name, signature)
            tools.append(Tool(schema["name"], function, parse_docstring(schema["description"]).summary,
                              signature_text, DEFAULT_LATENCY_MS, schema))
        return tools


class _McpFunction:
    """A tool of the server as a Python callable: ``__signature__`` is its schema's, for the registry."""

    def __init__(self, connection: McpConnection, name: str, signature: inspect.Signature):
        self.connection, self.name, self.__signature__ = connection, name, signature

    def __call__(self, *args: Any, **kwargs: Any) -> str:
        return self.connection.call(self.name, dict(self.__signature__.bind(*args, **kwargs).arguments))


def result_text(result: Any) -> str:
    """A ``CallToolResult`` as text: its text blocks joined by newlines (JSON ones on one line;
    ``[image image/png]`` and the like for other blocks), else its structured content as JSON. Raises :class:`McpToolError` with
    that text where the server marks the result as an error."""
    parts = []
    for block in result.content:
        if getattr(block, "type", None) == "text":
            parts.append(_compact(block.text))
        else:
            mime = getattr(block, "mime_type", None)
            parts.append(f"[{block.type}{' ' + mime if mime else ''}]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False, default=str))
    text = "\n".join(parts)
    if result.is_error:
        raise McpToolError(text or "the server reported an error")
    return text


def _compact(text: str) -> str:
    """A JSON object or array on one line, as a Python tool's result is written (servers often indent
    theirs: lines the model would read for nothing); any other text as it is."""
    if not text.lstrip().startswith(("{", "[")):
        return text
    try:
        return json.dumps(json.loads(text), ensure_ascii=False)
    except ValueError:
        return text


def _python_name(name: str) -> str:
    python = _NOT_A_NAME.sub("_", name)
    return f"_{python}" if python[:1].isdigit() else python


def _reason(error: BaseException) -> str:
    """The first leaf of an exception group (anyio's task groups wrap what went wrong), in one line."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
