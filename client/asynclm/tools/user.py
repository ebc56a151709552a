"""A user's own tools: a Python file of plain functions (``oven asynclm --tools my_tools.py``).

Every public function the file defines (its name not starting with ``_``; functions it
imports are not its own) becomes a tool, in the order of the file, described by its type
hints and docstring (:func:`~.function_schema.function_tool`). The functions run on the
client, on the executor's threads, with their real latencies; an ``async def`` runs in
an event loop of its own on its worker. What one returns is the interrupt's text (JSON
for a dict or list, ``str()`` of anything else); what one raises, an error result.

The prompt tells the model each tool's estimated execution time, which it uses to start
long calls first: a file may give them in milliseconds in a module-level dict,
``LATENCY_MS = {"search_papers": 800}``; a tool it leaves out is announced at
:data:`~.registry.DEFAULT_LATENCY_MS` (100 ms).

The file runs as ``python FILE`` would run it (its folder first on the import path), but
under a module name of its own, so that ``if __name__ == "__main__":`` blocks do not run.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import inspect
import itertools
import sys
import traceback

from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from .function_schema import function_tool
from .registry import DEFAULT_LATENCY_MS, Tool

__all__ = ["LATENCY_TABLE", "load_tools_file"]

LATENCY_TABLE = "LATENCY_MS"  # the module-level dict of estimated execution times
_module_numbers = itertools.count()


def load_tools_file(path: str | Path) -> list[Tool]:
    """The tools ``path`` defines.

    Raises ValueError, in one line naming the file, for a file that is missing, is no ``.py``
    file, does not import (its exception), defines no public function, has a function whose
    hints describe no call (see :func:`~.function_schema.function_schema`), or has a bad
    ``LATENCY_MS``.
    """
    path = Path(path)
    if path.suffix != ".py":
        raise ValueError(f"{path}: a tools file is a Python file (.py)")
    if not path.is_file():
        raise ValueError(f"{path}: no such file" if not path.exists() else f"{path}: not a file")
    module = _imported(path)
    functions = [value for name, value in vars(module).items()
                 if not name.startswith("_") and inspect.isfunction(value)
                 and value.__module__ == module.__name__]
    if not functions:
        raise ValueError(f"{path}: defines no function (each public function of the file is a tool; "
                         "names starting with _ are not)")
    latency_ms_by_name = _latency_table(path, module, {f.__name__ for f in functions})
    tools = []
    for function in functions:
        try:
            tool = function_tool(function, latency_ms_by_name.get(function.__name__, DEFAULT_LATENCY_MS))
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None
        if inspect.iscoroutinefunction(function):
            tool = Tool(tool.name, _run_to_completion(function), tool.description, tool.signature,
                        tool.latency_ms, tool.schema)
        tools.append(tool)
    return tools


def _imported(path: Path) -> ModuleType:
    name = f"oven_user_tools_{next(_module_numbers)}_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ValueError(f"{path}: cannot be imported")
    module = importlib.util.module_from_spec(spec)
    folder = str(path.resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)  # its own imports of modules beside it, now and when a tool runs
    sys.modules[name] = module  # (dataclasses and typing look a function's module up by name)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:
        del sys.modules[name]
        raise ValueError(f"{path}:{e.lineno}: syntax error: {e.msg}") from None
    except BaseException as e:  # whatever the user's module raises, SystemExit included
        del sys.modules[name]
        where = _line_in(path, e)
        raise ValueError(f"{path} does not import{where}: {type(e).__name__}: {e}") from None
    return module


def _line_in(path: Path, error: BaseException) -> str:
    """`` (line N)``: the line of ``path`` where ``error`` was raised or passed through last."""
    lines = [frame.lineno for frame in traceback.extract_tb(error.__traceback__)
             if Path(frame.filename).resolve() == path.resolve()]
    return f" (line {lines[-1]})" if lines else ""


def _latency_table(path: Path, module: ModuleType, names: set[str]) -> dict[str, float]:
    table = getattr(module, LATENCY_TABLE, {})
    if not isinstance(table, dict):
        raise ValueError(f"{path}: {LATENCY_TABLE} must be a dict of function name -> milliseconds")
    for name, ms in table.items():
        if name not in names:
            raise ValueError(f"{path}: {LATENCY_TABLE} names {name!r}, which is none of its tools "
                             f"({', '.join(sorted(names))})")
        if isinstance(ms, bool) or not isinstance(ms, (int, float)) or ms < 0:
            raise ValueError(f"{path}: {LATENCY_TABLE}[{name!r}] must be a number of milliseconds >= 0, "
                             f"not {ms!r}")
    return {name: float(ms) for name, ms in table.items()}


def _run_to_completion(function: Callable[..., Any]) -> Callable[..., Any]:
    """A coroutine function as a plain one: each call runs in a new event loop on the calling thread."""
    @functools.wraps(function)
    def run(*args: Any, **kwargs: Any) -> Any:
        return asyncio.run(function(*args, **kwargs))
    return run
