"""A Lark grammar of the calls a tool set allows, as the AsyncLM model writes them in CML.

One builder for every path that holds the model's calls to the tools' schemas: the OpenAI
front end's ``tool_choice`` (``client/openai_api/tools.py``: whole call lines, then the wait) and
``oven asynclm --constrain`` with the in-process check (:func:`call_grammar`: the text after a
call's ``[HEAD]``, up to its ``[END]``). A call is one of the tools' names, then its keyword
arguments in the model's style (``f(city=" Paris", n=2)``; strings in either quotes, as its
BFCL training calls write them single-quoted): known names, each once, every
required one present, in the signature's order (required ones first, as the prompt shows them:
:func:`~.schema.schema_signature`) or in the schema's own (BFCL's answers follow it), each value of
its schema's type (:func:`value_rule`). A tool without a schema takes any literal arguments.

Strings hold no ``[`` (nor a newline): inside a CML block a ``[`` could begin a delimiter, which
the token monitor reads wherever it appears.
"""

from __future__ import annotations

import json

__all__ = ["MAX_VALUE_DEPTH", "call_grammar", "function_rules", "literal", "registry_schemas", "value_rule"]

MAX_VALUE_DEPTH = 4  # nested arrays of a schema followed: deeper, any literal
END = " [END]"  # what closes a call block, as the model writes it (prompt.py's call_text)

TERMINALS = [
    r"""STRING: /" ?([^"\\\n\[]|\\[^\n\[])*"|' ?([^'\\\n\[]|\\[^\n\[])*'/""",
    r"INT: /-?[0-9]+/",
    r"NUMBER: /-?[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?/",
    'value: STRING | NUMBER | "True" | "False" | "None" | list | dict',
    'list: "[" (value (", " value)*)? "]"',
    'dict: "{" (STRING ": " value (", " STRING ": " value)*)? "}"',
    'anyargs: (anyarg (", " anyarg)*)?',
    'anyarg: (/[A-Za-z_][A-Za-z0-9_]*/ "=")? value',
]


def registry_schemas(registry) -> list[dict]:
    """Each tool's schema (``{"name", "parameters"}``); a tool without one takes any arguments."""
    return [tool.schema if tool.schema is not None else {"name": tool.name, "parameters": None}
            for tool in registry]


def call_grammar(schemas: list[dict]) -> str:
    """What a call block holds after ``[HEAD]``: one space, a call of one of ``schemas``, `` [END]``.
    ValueError for no schemas (no call could be written)."""
    if not schemas:
        raise ValueError("no tools to hold the calls to")
    names, rules = function_rules(schemas)
    return "\n".join([f"start: \" \" ({' | '.join(names)}) {json.dumps(END)}", *rules])


def function_rules(schemas: list[dict]) -> tuple[list[str], list[str]]:
    """``(rule names, rules)``: a rule per schema (``f0: "get_weather(" ... ")"``) and the terminals
    they use; a grammar alternates the names where a call may stand."""
    names, rules = [], []
    for i, schema in enumerate(schemas):
        names.append(f"f{i}")
        rules.append(f"f{i}: {json.dumps(schema['name'] + '(')} {_arguments(schema.get('parameters'))} \")\"")
    return names, rules + TERMINALS


def _arguments(parameters) -> str:
    """The keyword arguments a schema's ``parameters`` allow, as a Lark expression (module doc)."""
    if not isinstance(parameters, dict):
        return "anyargs"
    properties = parameters.get("properties", {})
    if not isinstance(properties, dict):
        return "anyargs"
    required = set(parameters.get("required", [])) & set(properties)
    signature = [n for n in properties if n in required] + [n for n in properties if n not in required]
    orders = [signature] + ([list(properties)] if list(properties) != signature else [])
    item = {name: f"{json.dumps(name + '=')} {value_rule(properties[name])}" for name in properties}
    forms = [_in_order([(name, name in required, item[name]) for name in order]) for order in orders]
    forms = [f for f in forms if f]
    return "" if not forms else forms[0] if len(forms) == 1 else f"({' | '.join(forms)})"


def _in_order(items: list[tuple[str, bool, str]]) -> str:
    """Items in this order, each optional one left out or not, commas between those given."""
    def after(i: int) -> str:  # items i.. once one was given: each after a comma
        return " ".join(f'", " {expr}' if req else f'(", " {expr})?' for _, req, expr in items[i:])

    def first(i: int) -> str:  # the first item given is item i or a later one (not empty)
        _, req, expr = items[i]
        head = f"{expr} {after(i + 1)}".strip()
        if req or i + 1 == len(items):
            return head
        return f"({head} | {first(i + 1)})"

    if not items:
        return ""
    form = first(0)
    return f"({form})?" if not any(req for _, req, _ in items) else form


def value_rule(schema, depth: int = 0) -> str:
    """A Lark expression for a Python literal of ``schema`` as the model writes it (strings double-quoted,
    opening with a space or not): enums and consts exactly, ``anyOf``/``oneOf`` and type lists as
    alternatives, arrays (BFCL's tuples too) of their items, BFCL's ``float`` as a number; objects,
    ``$ref`` and the rest as any literal (their keys and bounds, and strings' patterns, are not held)."""
    if not isinstance(schema, dict) or depth > MAX_VALUE_DEPTH:
        return "value"
    if "const" in schema:
        return _constant(schema["const"])
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return "(" + " | ".join(_constant(v) for v in schema["enum"]) + ")"
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            return "(" + " | ".join(value_rule(s, depth + 1) for s in schema[key]) + ")"
    kinds = schema.get("type")
    kinds = list(kinds) if isinstance(kinds, list) else [kinds]
    if "integer" in kinds and any(k in ("number", "float") for k in kinds):  # an int is a number already
        kinds.remove("integer")
    parts = []
    for kind in kinds:
        if kind == "string":
            parts.append("STRING")
        elif kind == "integer":
            parts.append("INT")
        elif kind in ("number", "float"):
            parts.append("NUMBER")
        elif kind == "boolean":
            parts.append('("True" | "False")')
        elif kind == "null":
            parts.append('"None"')
        elif kind in ("array", "tuple"):
            item = value_rule(schema.get("items", {}), depth + 1)
            parts.append(f'"[" ({item} (", " {item})*)? "]"')
        elif kind in ("object", "dict"):
            parts.append("dict")
        else:
            return "value"
    return parts[0] if len(parts) == 1 else "(" + " | ".join(parts) + ")"


def _constant(value) -> str:
    """One JSON value as the model may write it: a string in either quotes, with or without its opening space."""
    if isinstance(value, str):
        forms = dict.fromkeys(quoted(v) for v in (" " + value, value) for quoted in (literal, repr))
        return "(" + " | ".join(json.dumps(form) for form in forms) + ")"
    return json.dumps(literal(value))


def literal(value) -> str:
    """A JSON value as a Python literal in the model's style: strings in double quotes, as in its
    training calls (``get_weather(city=" Paris")``, the space added by ``spaced_call``),
    ``True``/``None``, lists and dicts alike."""
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)}: {literal(v)}" for k, v in value.items()) + "}"
    return json.dumps(value, ensure_ascii=False)
