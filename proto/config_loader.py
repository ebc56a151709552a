"""One loader for every layer's frozen config dataclass.

Precedence, lowest first: the dataclass defaults, a TOML file (``--config``, else
``OVEN_CONFIG``; the table named by ``section``), environment variables ``OVEN_<FIELD>``, then
command-line flags ``--field-name``. The dataclass validates the merged result
in ``__post_init__``, so every source gets the same clear error.

Each setting is declared once with :func:`setting`: its default, one line of help and, when it is
enumerated, its choices; ``--help`` and docs/configuration.md both read them from there.
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


def setting(default: Any, help: str, choices: tuple[str, ...] | None = None) -> Any:
    """A config dataclass field: its default, one line saying what it does, and its choices if it has a
    fixed set (argparse checks a flag against them; ``__post_init__`` checks every source)."""
    return dataclasses.field(default=default, metadata={"help": help, "choices": choices})


def setting_help(field: dataclasses.Field) -> str:
    return field.metadata.get("help", "")


def setting_choices(field: dataclasses.Field) -> tuple[str, ...] | None:
    return field.metadata.get("choices")


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


def settings(cls_or_config: Any) -> list[dataclasses.Field]:
    """The fields a user sets; a field with ``init=False`` is derived from them in ``__post_init__``."""
    return [f for f in dataclasses.fields(cls_or_config) if f.init]


def add_config_arguments(parser: argparse.ArgumentParser, cls: type) -> None:
    """Add ``--config`` and one optional flag per field of ``cls`` (defaults shown in --help)."""
    hints = typing.get_type_hints(cls)
    if "--config" not in parser._option_string_actions:  # several configs may share one parser
        parser.add_argument("--config", type=Path, metavar="FILE",
                            help="TOML file with [inference] / [control] / [openai] tables (default: $OVEN_CONFIG)")
    for field in settings(cls):
        kind, choices = _scalar_type(hints[field.name]), setting_choices(field)
        help_line = f"{setting_help(field)} (default: {default_text(field)}; env {env_name(field)})"
        parser.add_argument(
            flag_name(field), dest=field.name, default=None, type=_flag_type(kind), choices=choices,
            metavar=None if choices else kind.__name__.upper(), help=help_line.replace("%", "%%"),
        )


def setting_type(cls: type, field: dataclasses.Field) -> type:
    """What a setting holds (``int`` for ``int | None``)."""
    return _scalar_type(typing.get_type_hints(cls)[field.name])


def flag_name(field: dataclasses.Field) -> str:
    return "--" + field.name.replace("_", "-")


def env_name(field: dataclasses.Field) -> str:
    return f"OVEN_{field.name.upper()}"


def default_text(field: dataclasses.Field) -> str:
    """The default as --help shows it; None reads "derived" (the setting's help says from what)."""
    return {None: "derived", "": '""'}.get(field.default, str(field.default))


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
        unknown = set(table) - {f.name for f in settings(cls)}
        if unknown:
            raise ValueError(f"{config_file}: unknown settings in [{section}]: {', '.join(sorted(unknown))}")
        for name, value in table.items():
            try:
                values[name] = _from_file(_scalar_type(hints[name]), value)
            except ValueError as exc:
                raise ValueError(f"{config_file}: [{section}] {name}: {exc}") from None
    for field in settings(cls):
        env = os.environ.get(env_name(field))
        if env is not None:
            try:
                values[field.name] = _parse(_scalar_type(hints[field.name]), env)
            except ValueError as exc:
                raise ValueError(f"{env_name(field)}: {exc}") from None
        flag = getattr(args, field.name, None)
        if flag is not None:
            values[field.name] = flag
    values.update(overrides)
    return cls(**values)


def config_to_argv(config: Any) -> list[str]:
    """The flags that reproduce ``config`` (non-default fields only), for spawning a child process."""
    argv = []
    for field in settings(config):
        value = getattr(config, field.name)
        if value != field.default:
            argv += [flag_name(field), str(value)]
    return argv
