"""Tools the model may call, by name: their prompt descriptions and their execution.

A :class:`ToolRegistry` is what the client consults for every call the model
emits: :meth:`ToolRegistry.describe` writes the function definitions for the
system prompt (with estimated execution times, which an asynchronous model uses
to start long calls first), and :meth:`ToolRegistry.execute` runs one call text.
"""

from __future__ import annotations

import inspect
import json
import re

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from .call import ParsedCall, ToolError, parse_call

__all__ = ["DEFAULT_LATENCY_MS", "Tool", "ToolError", "ToolRegistry", "describe_line", "result_text"]

# The estimated execution time announced for a tool whose source states none (a user's function
# left out of its file's LATENCY_MS, an MCP server's tool).
DEFAULT_LATENCY_MS = 100.0


@dataclass(frozen=True, slots=True)
class Tool:
    """One callable tool.

    ``signature`` is the prompt text of the call (``get_weather(city: str)``);
    ``description`` is one line; ``latency_ms`` is the estimated execution time
    announced to the model (and, in emulations, the time a call is made to take).
    ``schema`` is the call's JSON schema as an OpenAI or BFCL function definition
    (``{"name", "description", "parameters"}``), where the tool's source gives one.
    """

    name: str
    function: Callable[..., Any]
    description: str
    signature: str
    latency_ms: float
    schema: dict | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a tool needs a name")
        if self.latency_ms < 0:
            raise ValueError(f"{self.name}: latency_ms must be >= 0, got {self.latency_ms}")

    @classmethod
    def from_function(
        cls, function: Callable[..., Any], latency_ms: float, description: str | None = None
    ) -> Tool:
        """A tool named after ``function``, its signature text taken from the annotations
        and its description from the docstring's first line unless given."""
        doc_line = (inspect.getdoc(function) or "").strip().split("\n")[0]
        return cls(
            name=function.__name__,
            function=function,
            description=description if description is not None else doc_line,
            signature=f"{function.__name__}{_signature_text(function)}",
            latency_ms=latency_ms,
        )

    def describe(self) -> str:
        return describe_line(self.signature, self.description, self.latency_ms)


def describe_line(signature: str, description: str, latency_ms: float) -> str:
    """One function definition line of the system prompt."""
    one_line = " ".join(description.split())
    return f"- {signature}: {one_line} (estimated execution time: {latency_ms:.0f} ms)"


def result_text(value: Any) -> str:
    """A tool's return value as the text handed to the model: JSON for dicts and
    lists (non-JSON leaves such as datetimes written with ``str``), ``str`` otherwise."""
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, ensure_ascii=False, default=str)
    return str(value)


class ToolRegistry:
    """Tools by name. Registering a name twice is an error (a silent replacement would
    make the prompt and the executed function disagree)."""

    def __init__(self, tools: list[Tool] | None = None):
        self._tool_by_name: dict[str, Tool] = {}
        for tool in tools or []:
            self.register(tool)

    def __len__(self) -> int:
        return len(self._tool_by_name)

    def __contains__(self, name: object) -> bool:
        return name in self._tool_by_name

    def __iter__(self) -> Iterator[Tool]:
        return iter(list(self._tool_by_name.values()))

    def register(self, tool: Tool) -> None:
        if tool.name in self._tool_by_name:
            raise ValueError(f"tool {tool.name!r} is already registered")
        self._tool_by_name[tool.name] = tool

    def get(self, name: str) -> Tool:
        """The tool called ``name``; raises :class:`KeyError` if there is none."""
        return self._tool_by_name[name]

    def describe(self) -> str:
        """Function definitions for a system prompt, one line per tool, in registration order."""
        return "\n".join(tool.describe() for tool in self._tool_by_name.values())

    def calls_written_in(self, text: str) -> list[str]:
        """The tools ``text`` calls in plain words (``get_weather(city="Oslo")`` outside CML), in order:
        a model that writes a call as prose has not abstained, though it made no call."""
        if not self._tool_by_name:
            return []
        names = "|".join(re.escape(name) for name in sorted(self._tool_by_name, key=len, reverse=True))
        return re.findall(rf"(?<![\w.])({names})\s*\(", text)

    def latency_s(self, call_text: str) -> float:
        """The called tool's estimated execution time in seconds; 0 when the call does
        not parse or names no tool (it then fails at once, as a real one would)."""
        try:
            tool = self._tool_by_name.get(parse_call(call_text).name)
        except ToolError:
            return 0.0
        return tool.latency_ms / 1000.0 if tool is not None else 0.0

    def named(self, call: ParsedCall) -> ParsedCall:
        """``call`` with its positional arguments named by the tool's signature
        (``get_zipcode('Oslo')`` -> ``get_zipcode(city='Oslo')``): two ways of writing one call
        become one. ``call`` as it is where no tool has its name or its arguments do not fit."""
        tool = self._tool_by_name.get(call.name)
        if tool is None or not call.args:
            return call
        try:
            signature = inspect.signature(tool.function)
            bound = signature.bind(*call.args, **call.kwargs)
        except (TypeError, ValueError):
            return call
        kwargs: dict[str, Any] = {}
        for name, value in bound.arguments.items():
            kind = signature.parameters[name].kind
            if kind is inspect.Parameter.VAR_POSITIONAL:
                return call  # *args have no names to give
            if kind is inspect.Parameter.VAR_KEYWORD:
                kwargs.update(value)
            else:
                kwargs[name] = value
        return ParsedCall(call.name, (), kwargs)

    def execute(self, call_text: str) -> str:
        """Run one Python-syntax call and return its result as text (see :func:`result_text`).

        Raises :class:`ToolError`, whose message names the call, for bad syntax or a
        non-literal argument (see :func:`~.call.parse_call`), an unknown function,
        arguments that do not fit the function's signature, or any exception raised
        inside the tool.
        """
        call = parse_call(call_text)
        text = call_text.strip()
        tool = self._tool_by_name.get(call.name)
        if tool is None:
            raise ToolError(f"{text}: unknown function {call.name!r}")
        try:
            inspect.signature(tool.function).bind(*call.args, **call.kwargs)
        except TypeError as e:
            raise ToolError(f"{text}: wrong arguments: {e}") from None
        except ValueError:
            pass  # some builtins have no introspectable signature: let the call decide
        try:
            value = tool.function(*call.args, **call.kwargs)
        except Exception as e:
            raise ToolError(f"{text}: {type(e).__name__}: {e}") from e
        return result_text(value)


def _signature_text(function: Callable[..., Any]) -> str:
    # Annotations may be strings (from __future__ import annotations); show them bare.
    signature = inspect.signature(function)
    parts = []
    for parameter in signature.parameters.values():
        part = parameter.name
        if parameter.annotation is not inspect.Parameter.empty:
            annotation = parameter.annotation
            if not isinstance(annotation, str):
                annotation = inspect.formatannotation(annotation)
            part += f": {annotation}"
        if parameter.default is not inspect.Parameter.empty:
            part += f" = {parameter.default!r}"
        parts.append(part)
    return f"({', '.join(parts)})"
