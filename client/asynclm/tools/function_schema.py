"""A plain Python function as a tool: its JSON schema from its type hints and its docstring.

The schema has the shape of an OpenAI or BFCL function definition (the shape
:mod:`~.schema` reads and the OpenAI front end checks)::

    {"name": "get_weather", "description": "Current weather for a city.",
     "parameters": {"type": "object",
                    "properties": {"city": {"type": "string", "description": "The city."},
                                   "unit": {"type": "string", "enum": ["c", "f"], "default": "c"}},
                    "required": ["city"]}}

The description is the docstring's first paragraph, each parameter's its entry in an
``Args:`` or ``Parameters`` section (:mod:`~.docstring`). A parameter with a default is
optional. The model writes a call's arguments as Python literals, so only types a literal
can be are described: ``str``, ``int``, ``float``, ``bool``, ``list``/``list[X]``,
``tuple``, ``dict``, ``Literal[...]`` (an enum), ``X | None`` (as ``X``), unions of these,
and no annotation or ``Any`` (any value).
"""

from __future__ import annotations

import inspect
import json
import types
import typing

from collections.abc import Callable
from typing import Any, Literal, Union

from .docstring import parse_docstring
from .registry import Tool

__all__ = ["annotation_schema", "function_schema", "function_tool"]

_JSON_TYPE_BY_PYTHON_TYPE: dict[type, str] = {
    str: "string", int: "integer", float: "number", bool: "boolean",
    list: "array", tuple: "array", dict: "object",
}
SUPPORTED_TYPES = "str, int, float, bool, list, tuple, dict, Literal[...], X | None, Any"


def function_tool(function: Callable[..., Any], latency_ms: float) -> Tool:
    """``function`` as a tool: its prompt signature and its schema (see :func:`function_schema`),
    its description the docstring's first paragraph. Raises ValueError as that does."""
    schema = function_schema(function)
    tool = Tool.from_function(function, latency_ms, description=schema["description"])
    return Tool(tool.name, tool.function, tool.description, tool.signature, tool.latency_ms, schema)


def function_schema(function: Callable[..., Any]) -> dict:
    """The JSON schema of ``function``'s call (the module doc's shape).

    Raises ValueError naming the function and the parameter for ``*args``/``**kwargs`` (the model
    names every argument it may give), a type hint that cannot be resolved, or a type no Python
    literal has (a class of the user's, a datetime).
    """
    name = function.__name__
    try:
        hints = typing.get_type_hints(function)
    except Exception as e:  # a string annotation naming something undefined, say
        raise ValueError(f"{name}: its type hints do not resolve: {type(e).__name__}: {e}") from None
    doc = parse_docstring(function.__doc__)
    properties: dict[str, dict] = {}
    required: list[str] = []
    for parameter in inspect.signature(function).parameters.values():
        if parameter.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            stars = "*" if parameter.kind is inspect.Parameter.VAR_POSITIONAL else "**"
            raise ValueError(f"{name}: {stars}{parameter.name}: a tool's parameters must each have a name")
        try:
            schema = annotation_schema(hints.get(parameter.name, Any))
        except ValueError as e:
            raise ValueError(f"{name}: parameter {parameter.name!r}: {e}") from None
        if parameter.name in doc.arg_descriptions:
            schema["description"] = doc.arg_descriptions[parameter.name]
        if parameter.default is inspect.Parameter.empty:
            required.append(parameter.name)
        elif _is_json(parameter.default):
            schema["default"] = parameter.default
        properties[parameter.name] = schema
    return {"name": name, "description": doc.summary,
            "parameters": {"type": "object", "properties": properties, "required": required}}


def annotation_schema(annotation: Any) -> dict:
    """The JSON schema of values of a type hint; ValueError for a type no Python literal has."""
    if annotation is Any:
        return {}
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal:
        value_types = {type(value) for value in args}
        if len(value_types) == 1 and value_types <= _JSON_TYPE_BY_PYTHON_TYPE.keys():
            return {"type": _JSON_TYPE_BY_PYTHON_TYPE[value_types.pop()], "enum": list(args)}
        return {"enum": list(args)}
    if origin in (Union, types.UnionType):
        members = [annotation_schema(arg) for arg in args if arg is not type(None)]
        return members[0] if len(members) == 1 else {"anyOf": members}
    if origin in (list, tuple, set, frozenset) or annotation in (set, frozenset):
        schema: dict = {"type": "array"}
        if origin in (list, set, frozenset) and args or (origin is tuple and len(args) == 2 and args[1] is ...):
            schema["items"] = annotation_schema(args[0])
        return schema
    if origin is dict:
        return {"type": "object"}
    if annotation in _JSON_TYPE_BY_PYTHON_TYPE:
        return {"type": _JSON_TYPE_BY_PYTHON_TYPE[annotation]}
    raise ValueError(f"type {inspect.formatannotation(annotation)} is no Python literal's "
                     f"(the model writes literals: use {SUPPORTED_TYPES})")


def _is_json(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True
