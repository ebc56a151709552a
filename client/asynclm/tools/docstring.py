"""What a tool's docstring says: its summary and, per parameter, a description.

A user's tool is a plain Python function; its docstring is the description the model reads.
:func:`parse_docstring` takes the first paragraph as the summary and reads the parameter
descriptions of a Google-style ``Args:`` section or a NumPy-style ``Parameters`` section::

    Args:                                 Parameters
        city: The city, e.g. "Paris".     ----------
        unit (str): "c" or "f"; wrapped     city : str
            lines continue the entry.           The city, e.g. "Paris".

Anything else in the docstring (Returns, Raises, Examples) is not read.
"""

from __future__ import annotations

import inspect
import re

from dataclasses import dataclass, field

__all__ = ["Docstring", "parse_docstring"]

_GOOGLE_HEADERS = {"args:", "arguments:", "parameters:", "params:", "keyword args:", "keyword arguments:"}
_NUMPY_HEADERS = {"parameters", "arguments", "args", "other parameters"}
# `name: text` or `name (type): text`; `*args` and `**kwargs` keep their stars out of the name.
_GOOGLE_ENTRY = re.compile(r"\*{0,2}(?P<names>\w+)\s*(?:\([^)]*\))?\s*:\s*(?P<text>.*)")
# `name`, `name : type` or `x, y : type`; the description is on the lines below.
_NUMPY_ENTRY = re.compile(r"(?P<names>\*{0,2}\w+(?:\s*,\s*\*{0,2}\w+)*)\s*(?::.*)?")


@dataclass(frozen=True, slots=True)
class Docstring:
    """``summary``: the first paragraph on one line; ``arg_descriptions``: parameter name -> its text."""

    summary: str
    arg_descriptions: dict[str, str] = field(default_factory=dict)


def parse_docstring(doc: str | None) -> Docstring:
    """The summary and the parameter descriptions of ``doc`` (a raw ``__doc__``; None reads as empty)."""
    lines = inspect.cleandoc(doc or "").splitlines()
    summary = []
    for i, line in enumerate(lines):
        if not line.strip() or _section_at(lines, i):
            break
        summary.append(line.strip())
    descriptions: dict[str, str] = {}
    for i, line in enumerate(lines):
        section = _section_at(lines, i)
        if section == "google":
            descriptions.update(_entries(lines, i + 1, _indent(line), google=True))
        elif section == "numpy":
            descriptions.update(_entries(lines, i + 2, _indent(line), google=False))
    return Docstring(" ".join(summary), descriptions)


def _section_at(lines: list[str], i: int) -> str | None:
    """"google" or "numpy" where line ``i`` opens a parameters section, else None."""
    header = lines[i].strip().lower()
    if header in _GOOGLE_HEADERS:
        return "google"
    if header in _NUMPY_HEADERS and i + 1 < len(lines) and _is_rule(lines[i + 1]):
        return "numpy"
    return None


def _entries(lines: list[str], start: int, header_indent: int, google: bool) -> dict[str, str]:
    """Parameter name -> description, from the section's entries from line ``start`` on.

    An entry starts at the indentation of the section's first entry; deeper lines continue
    it. A Google section ends at a line no deeper than its header, a NumPy one at the next
    header (a line underlined by dashes) or a line shallower than its header."""
    parts_by_name: dict[str, list[str]] = {}
    current: list[list[str]] = []  # the parts lists of the entry being read (several for `x, y : int`)
    entry_indent = None
    for j in range(start, len(lines)):
        line = lines[j]
        if not line.strip():
            continue
        indent = _indent(line)
        ended = indent <= header_indent if google else (
            indent < header_indent or (j + 1 < len(lines) and _is_rule(lines[j + 1])))
        if ended:
            break
        if entry_indent is None:
            entry_indent = indent
        if indent <= entry_indent:
            match = (_GOOGLE_ENTRY if google else _NUMPY_ENTRY).fullmatch(line.strip())
            if match is None:
                break
            names = [name.strip().lstrip("*") for name in match["names"].split(",")]
            current = [parts_by_name.setdefault(name, []) for name in names]
            if google and match["text"]:
                for parts in current:
                    parts.append(match["text"].strip())
        else:
            for parts in current:
                parts.append(line.strip())
    return {name: " ".join(parts) for name, parts in parts_by_name.items()}


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _is_rule(line: str) -> bool:
    text = line.strip()
    return len(text) >= 3 and set(text) == {"-"}
