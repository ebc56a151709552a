"""Function-call text: parsing what the model wrote, and writing calls back out.

The model writes calls in Python syntax (``get_weather(city='Paris')``). The text
comes from a language model, so it is untrusted: it is parsed with :mod:`ast` and
only a function name with literal arguments is accepted. Nothing is ever
evaluated; :func:`ast.literal_eval` builds each argument value, so a call such as
``f(os.system('x'))`` is rejected rather than run.

A string argument may open with one space, which is not part of the value
(``get_weather(city=" Zurich")`` asks for ``"Zurich"``); write two to pass one.
The fine-tuned model writes every string argument that way (:func:`spaced_call`)
because BPE tokenises a name after a space as the question does (`` Zurich`` is
one token), while right after a quote the name must be spelt in pieces
(``Z``, ``ur``, ``ich``), which a small model gets wrong for names it never
saw spelt; see ``bench/asynclm_copying.py``.
"""

from __future__ import annotations

import ast

from dataclasses import dataclass
from typing import Any

__all__ = ["ToolError", "ParsedCall", "parse_call", "format_call", "spaced_call"]


class ToolError(Exception):
    """A call could not be executed: bad syntax, unknown function, wrong arguments
    or an exception inside the tool. The message names the call, so that it can be
    handed back to the model as the call's result."""


@dataclass(frozen=True, slots=True)
class ParsedCall:
    """One call as text was parsed: ``name(*args, **kwargs)``.

    ``name`` may be dotted (``spotify.play``): it is a registry key, looked up as
    text, never resolved as an attribute.
    """

    name: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


def parse_call(call_text: str) -> ParsedCall:
    """Parse one call written in Python syntax.

    Raises :class:`ToolError` for a syntax error, anything other than a single
    call of a (dotted) name, ``*args``/``**kwargs`` unpacking, a repeated keyword,
    or an argument that is not a literal (names, calls, attribute access, ...).
    """
    text = call_text.strip()
    return _parsed(text, _call_node(text))


def _call_node(text: str) -> ast.Call:
    try:
        node = ast.parse(text, mode="eval").body
    except SyntaxError as e:
        raise ToolError(f"{text}: syntax error: {e.msg}") from None
    if not isinstance(node, ast.Call):
        raise ToolError(f"{text}: not a function call")
    return node


def _parsed(text: str, node: ast.Call) -> ParsedCall:
    name = _dotted_name(node.func)
    if name is None:
        raise ToolError(f"{text}: the called function must be a plain name")
    args = tuple(_unspaced(_literal(text, arg)) for arg in node.args)
    kwargs: dict[str, Any] = {}
    for keyword in node.keywords:
        if keyword.arg is None:
            raise ToolError(f"{text}: **-unpacking is not allowed")
        if keyword.arg in kwargs:
            raise ToolError(f"{text}: argument {keyword.arg!r} given twice")
        kwargs[keyword.arg] = _unspaced(_literal(text, keyword.value))
    return ParsedCall(name, args, kwargs)


def format_call(name: str, kwargs: dict[str, Any]) -> str:
    """The Python-syntax text of ``name(**kwargs)``; :func:`parse_call` reads it back."""
    arguments = ", ".join(f"{key}={value!r}" for key, value in kwargs.items())
    return f"{name}({arguments})"


def spaced_call(call_text: str) -> str:
    """``call_text`` with one space opening each string argument that is a plain quoted literal
    (``f(city="Oslo", n=2)`` -> ``f(city=" Oslo", n=2)``), the form the model is trained to write.
    ``call_text``'s literals are the values: :func:`parse_call` reads the result back as them
    (``f(x=" a")`` -> ``f(x="  a")``, ``x`` still ``" a"``). Raises :class:`ToolError` as it does."""
    text = call_text.strip()
    node = _call_node(text)
    _parsed(text, node)  # refused as parse_call refuses it
    if "\n" in text:  # a one-line call is all the training data holds; offsets below are line 1's
        return text
    raw = text.encode()  # ast offsets count UTF-8 bytes
    quotes = sorted(arg.col_offset for arg in (*node.args, *(k.value for k in node.keywords))
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str)
                    and raw[arg.col_offset:arg.col_offset + 1] in (b'"', b"'")
                    and raw[arg.col_offset:arg.col_offset + 3] not in (b'"""', b"'''"))
    for offset in reversed(quotes):
        raw = raw[:offset + 1] + b" " + raw[offset + 1:]
    return raw.decode()


def _unspaced(value: Any) -> Any:
    return value[1:] if isinstance(value, str) and value.startswith(" ") else value


def _dotted_name(node: ast.expr) -> str | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def _literal(text: str, node: ast.expr) -> Any:
    if isinstance(node, ast.Starred):
        raise ToolError(f"{text}: *-unpacking is not allowed")
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise ToolError(
            f"{text}: argument {ast.unparse(node)!r} is not a literal value"
        ) from None
