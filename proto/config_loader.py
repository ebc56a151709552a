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
            type=(lambda text, k=kind: _parse(k, text)),
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
        unknown = set(table) - {f.name for f in _settings(cls)}
        if unknown:
            raise ValueError(f"{config_file}: unknown settings in [{section}]: {', '.join(sorted(unknown))}")
        values.update(table)
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
