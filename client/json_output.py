"""``--json`` on the CLI's listing verbs: one JSON document on stdout, keyed as the protocol is.

A verb prints the reply message it got (``proto/control.py``) as its fields, so the keys are the
protocol's own snake_case names and stay as stable as the protocol; the flag's help names them,
and so does the generated CLI reference.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys


def add_json_flag(parser: argparse.ArgumentParser, *shapes: str) -> None:
    """``--json``, whose help gives the document's ``shapes`` (from :func:`shape`)."""
    parser.add_argument("--json", action="store_true",
                        help=f"print one JSON document instead: {'; '.join(shapes)}")


def shape(message: type, entry: type | None = None, when: str = "") -> str:
    """How ``message`` reads as JSON, naming its keys (and those of ``entry``, its one list's items)."""
    keys = ", ".join(f.name for f in dataclasses.fields(entry or message))
    if entry is None:
        text = f"an object with {keys}"
    else:
        (field,) = dataclasses.fields(message)
        text = f'{{"{field.name}": [...]}}, each item with {keys}'
    return f"{when}: {text}" if when else text


def print_json(value: object) -> None:
    """``value`` (a protocol message, or plain data holding some) as one JSON document on stdout."""
    json.dump(_plain(value), sys.stdout, indent=2, ensure_ascii=False)
    sys.stdout.write("\n")
    sys.stdout.flush()


def _plain(value: object) -> object:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value
