"""One loader for every layer's frozen config dataclass.

Precedence, lowest first: the dataclass defaults, a TOML file (``--config``, else
``OVEN_CONFIG``; the table named by ``section``), environment variables ``OVEN_<FIELD>``, then
command-line flags ``--field-name``. The dataclass validates the merged result
in ``__post_init__``, so every source gets the same clear error.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tomllib
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _scalar_type(hint: Any) -> type:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if args else hint


def _parse(kind: type, text: str) -> Any:
    if kind is bool:
        if text.lower() in ("1", "true", "yes", "on"):
            return True
        if text.lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"expected a boolean, got {text!r}")
    return kind(text)


def _flag_type(kind: type) -> Callable[[str], Any]:
    """``kind``'s parser for argparse, named so a bad flag reads ``invalid boolean value: 'maybe'``."""
    def parse(text: str) -> Any:
        return _parse(kind, text)
    parse.__name__ = "boolean" if kind is bool else kind.__name__
    return parse


def _from_file(kind: type, value: Any) -> Any:
    """A TOML ``value`` for a ``kind`` setting; an int does for a float, but a boolean is no number."""
    numeric = (int, float) if kind is float else kind
    if isinstance(value, bool) != (kind is bool) or not isinstance(value, numeric):
        raise ValueError(f"expected {'a boolean' if kind is bool else kind.__name__}, "
                         f"got {type(value).__name__} {value!r}")
    return float(value) if kind is float else value


def blocking_file(folder: Path) -> Path | None:
    """The file standing where ``folder``, or a folder above it, must be; None when ``folder`` is one or
    can be made (for settings that name folders: said at start, not when a slow step first writes there)."""
    existing = next((p for p in (folder, *folder.parents) if os.path.exists(p)), None)  # unreadable: go up
    return existing if existing is not None and not existing.is_dir() else None


def _settings(cls_or_config: Any) -> list[dataclasses.Field]:
    """The fields a user sets; a field with ``init=False`` is derived from them in ``__post_init__``."""
    return [f for f in dataclasses.fields(cls_or_config) if f.init]


def add_config_arguments(parser: argparse.ArgumentParser, cls: type) -> None:
    """Add ``--config`` and one optional flag per field of ``cls`` (defaults shown in --help)."""
    hints = typing.get_type_hints(cls)
    if "--config" not in parser._option_string_actions:  # several configs may share one parser
        parser.add_argument("--config", type=Path, help="TOML file with [inference] / [control] / [openai] tables "
                                                        "(default: $OVEN_CONFIG)")
    for field in _settings(cls):
        kind = _scalar_type(hints[field.name])
        default = field.default if field.default is not dataclasses.MISSING else None
        parser.add_argument(
            "--" + field.name.replace("_", "-"), dest=field.name, default=None,
            type=_flag_type(kind),
            metavar=kind.__name__.upper(),
            help=f"default: {'derived' if default is None else default} (env OVEN_{field.name.upper()})",
        )


def config_from_args(cls: type, args: argparse.Namespace, section: str = "inference", **overrides: Any):
    """Merge defaults < TOML file < environment < flags < ``overrides`` into a ``cls``."""
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    config_file = getattr(args, "config", None) or os.environ.get("OVEN_CONFIG")
    if config_file:
        try:
            table = tomllib.loads(Path(config_file).read_text()).get(section, {})
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ValueError(f"{config_file}: {exc}") from None
        if not isinstance(table, dict):
            raise ValueError(f"{config_file}: {section} must be a table ([{section}]), not {type(table).__name__}")
        unknown = set(table) - {f.name for f in _settings(cls)}
        if unknown:
            raise ValueError(f"{config_file}: unknown settings in [{section}]: {', '.join(sorted(unknown))}")
        for name, value in table.items():
            try:
                values[name] = _from_file(_scalar_type(hints[name]), value)
            except ValueError as exc:
                raise ValueError(f"{config_file}: [{section}] {name}: {exc}") from None
    for field in _settings(cls):
        env = os.environ.get(f"OVEN_{field.name.upper()}")
        if env is not None:
            try:
                values[field.name] = _parse(_scalar_type(hints[field.name]), env)
            except ValueError as exc:
                raise ValueError(f"OVEN_{field.name.upper()}: {exc}") from None
        flag = getattr(args, field.name, None)
        if flag is not None:
            values[field.name] = flag
    values.update(overrides)
    return cls(**values)


def config_to_argv(config: Any) -> list[str]:
    """The flags that reproduce ``config`` (non-default fields only), for spawning a child process."""
    argv = []
    for field in _settings(config):
        value = getattr(config, field.name)
        if value != field.default:
            argv += ["--" + field.name.replace("_", "-"), str(value)]
    return argv
