"""Tools described only by a JSON schema (BFCL's function definitions).

BFCL's single-turn sets (parallel, live parallel) give each function as a JSON
schema with no implementation. :func:`schema_signature` turns a schema into the
prompt's signature text and a :class:`inspect.Signature`; :class:`SchemaStub`
"executes" such a function: it accepts exactly the calls the schema allows (known
parameter names, every required one present) and returns a synthetic result
derived from the arguments alone. It does not check value types or enums.
"""

from __future__ import annotations

import hashlib
import inspect
import json

from typing import Any

__all__ = ["SchemaStub", "schema_signature", "schema_tool_text"]

# JSON-schema type names as BFCL writes them -> the Python names a model expects.
_PYTHON_TYPE_BY_SCHEMA_TYPE = {
    "string": "str", "integer": "int", "float": "float", "number": "float",
    "boolean": "bool", "array": "list", "tuple": "tuple", "dict": "dict", "object": "dict",
    "any": "Any", "null": "None",
}


def schema_signature(schema: dict) -> inspect.Signature:
    """The Python signature a schema allows: required parameters first (no default),
    then the optional ones (their schema default, or None). Parameters may be given
    by position in that order or by keyword."""
    parameters = schema.get("parameters", {})
    properties: dict[str, dict] = parameters.get("properties", {})
    required = [name for name in properties if name in parameters.get("required", [])]
    optional = [name for name in properties if name not in required]
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    return inspect.Signature(
        [inspect.Parameter(name, kind) for name in required]
        + [
            inspect.Parameter(name, kind, default=properties[name].get("default"))
            for name in optional
        ]
    )


def schema_tool_text(schema: dict) -> tuple[str, str]:
    """``(signature, description)`` prompt texts of a schema, e.g.
    ``("get_current_weather(location: str, unit: str = 'fahrenheit')", "Retrieves ...")``."""
    properties: dict[str, dict] = schema.get("parameters", {}).get("properties", {})
    parts = []
    for parameter in schema_signature(schema).parameters.values():
        part = f"{parameter.name}: {_type_text(properties[parameter.name])}"
        if parameter.default is not inspect.Parameter.empty:
            part += f" = {parameter.default!r}"
        parts.append(part)
    return f"{schema['name']}({', '.join(parts)})", schema.get("description", "")


def _type_text(schema: dict) -> str:
    """The Python name of a property's type: ``str``; ``str | None`` for a list of types or an
    ``anyOf`` (as MCP servers write optional parameters); ``Any`` when it names none."""
    schema_type = schema.get("type") if isinstance(schema, dict) else None
    if isinstance(schema_type, list):
        return " | ".join(_PYTHON_TYPE_BY_SCHEMA_TYPE.get(t, str(t)) for t in schema_type) or "Any"
    if schema_type is None:
        members = schema.get("anyOf") or schema.get("oneOf") if isinstance(schema, dict) else None
        return " | ".join(_type_text(m) for m in members) if isinstance(members, list) and members else "Any"
    return _PYTHON_TYPE_BY_SCHEMA_TYPE.get(schema_type, str(schema_type))


class SchemaStub:
    """A stand-in implementation of a schema-only function.

    Calling it with arguments the schema allows returns
    ``{"status": "success", "function": name, "arguments": {...}, "result_id": "<hex>"}``,
    where ``result_id`` is a hash of the call: deterministic, distinct per call.
    Arguments the schema does not allow raise :class:`TypeError`; the registry
    checks them against ``__signature__`` before calling, as for a real function.
    """

    def __init__(self, schema: dict):
        self.name: str = schema["name"]
        self.__signature__ = schema_signature(schema)

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        arguments = dict(self.__signature__.bind(*args, **kwargs).arguments)
        canonical = json.dumps([self.name, arguments], sort_keys=True, default=str)
        return {
            "status": "success",
            "function": self.name,
            "arguments": arguments,
            "result_id": hashlib.sha256(canonical.encode()).hexdigest()[:12],
        }
