"""Checks of a Python inferlet's sources before and while componentize-py builds it.

componentize-py runs the inferlet's entry module at build time and keeps a snapshot: at run time
there is no file system, so only modules imported while building exist. The build's entry module
(:func:`entry_module`) therefore imports every module the sources import anywhere (a function's
``import json`` works at run time too) before it imports ``app``, and:

* **Syntax, by the guest's parser.** The sandbox runs CPython 3.14 (componentize-py 0.25.1); the
  host may be older. Every ``.py`` of the folder is compiled on the host first; a file the host
  cannot parse is parsed again by the entry module, inside the guest, so 3.12+ syntax builds (what
  it imports is imported there, where it can be) and a real error is the guest's own, reported as
  file:line:col (:func:`guest_syntax_error`).
* **Imports.** The module path holds the inferlet's folder, the SDK and the guest's standard
  library, never the host's site-packages (the build passes componentize-py an empty virtual
  environment). An import of anything else, or of a standard module that cannot work in the
  sandbox, fails before the build, naming the module and its line (:func:`check_imports`).
"""

from __future__ import annotations

import ast
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

GUEST_PYTHON = (3, 14)
# The guest's standard library (its sys.stdlib_module_names, measured on componentize-py 0.25.1) is the
# host 3.11's less what 3.12/3.13 removed, plus what 3.12-3.14 added.
GUEST_REMOVED = {"aifc", "asynchat", "asyncore", "audioop", "cgi", "cgitb", "chunk", "crypt", "distutils", "imghdr",
                 "imp", "lib2to3", "mailcap", "msilib", "nis", "nntplib", "ossaudiodev", "pipes", "smtpd", "sndhdr",
                 "spwd", "sunau", "telnetlib", "uu", "xdrlib"}
GUEST_ADDED = {"annotationlib", "compression"}
# Standard modules that are absent from the guest, or import there but cannot do their job in the sandbox.
SANDBOXED = {
    "subprocess": "an inferlet cannot start processes",
    "multiprocessing": "an inferlet cannot start processes",
    "concurrent": "an inferlet has one thread: use inferlet.spawn and inferlet.gather",
    "asyncio": "an inferlet's tasks run on the SDK's own loop: use inferlet.spawn, gather and sleep",
    "socket": "an inferlet opens no sockets: use inferlet.fetch",
    "ssl": "an inferlet opens no sockets: use inferlet.fetch",
    "urllib.request": "an inferlet opens no sockets: use inferlet.fetch",
    "http.client": "an inferlet opens no sockets: use inferlet.fetch",
    "ctypes": "an inferlet cannot load native libraries",
}
GENERATED = {"wit_world", "componentize_py_types", "componentize_py_runtime", "componentize_py_async_support",
             "poll_loop"}
ENTRY_MODULE = "oven_entry"


class SourceError(Exception):
    """A source the sandbox cannot run; the message is meant for the user as it is."""


def host_syntax_errors(folder: Path, shown) -> dict[Path, str]:
    """Files under ``folder`` the host cannot compile -> the error as file:line:col and the line."""
    errors = {}
    for path in python_files(folder):
        try:
            compile(path.read_bytes(), str(path), "exec", dont_inherit=True)
        except SyntaxError as exc:
            errors[path] = syntax_message(shown(path), exc.lineno, exc.offset, exc.msg, exc.text)
        except ValueError as exc:  # source with null bytes
            raise SourceError(f"{shown(path)}: {exc}") from None
    return errors


def host_is_guest() -> bool:
    """Does the host parse the guest's Python (so its syntax errors are the guest's)?"""
    return sys.version_info[:2] >= GUEST_PYTHON


def syntax_message(where: str, line: int | None, col: int | None, msg: str, text: str | None) -> str:
    lines = [f"{where}:{line}" + (f":{col}" if col else "") + f": SyntaxError: {msg}"]
    if text and text.strip():
        lines.append("    " + text.strip())
        if col:
            indent = len(text) - len(text.lstrip())
            lines.append("    " + " " * max(col - 1 - indent, 0) + "^")
    return "\n".join(lines)


def python_files(folder: Path):
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = [d for d in dirnames if d not in ("__pycache__", "target") and not d.startswith(".")]
        yield from sorted(Path(dirpath, name) for name in filenames if name.endswith(".py"))


# -- imports ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Import:
    path: Path
    line: int
    module: str


def check_imports(folder: Path, module_path: list[Path], skip: set[Path], shown) -> None:
    """Raise :class:`SourceError` for the first import under ``folder`` that cannot work in the sandbox."""
    stdlib = (set(sys.stdlib_module_names) - GUEST_REMOVED) | GUEST_ADDED
    for imp in _imports(folder, skip):
        top = imp.module.split(".")[0]
        why = SANDBOXED.get(imp.module) or SANDBOXED.get(top)
        if why is None and (top in stdlib or top in GENERATED or _local(top, module_path)):
            continue
        where = f"{shown(imp.path)}:{imp.line}: import {imp.module}"
        if why is not None:
            raise SourceError(f"{where}: {why}")
        raise SourceError(f"{where}: no module {top!r} in the inferlet's module path (its folder, the SDK and the "
                          "sandbox's standard library). Packages installed on this machine are not bundled, and "
                          "compiled extension modules cannot run in the sandbox; a pure-Python module can be "
                          "copied into the inferlet's folder.")


def _imports(folder: Path, skip: set[Path]):
    """Absolute imports in the folder's files, but those guarded by ``except ImportError``."""
    for path in python_files(folder):
        if path in skip:
            continue
        tree = ast.parse(path.read_bytes(), str(path))
        guarded = {id(node) for t in ast.walk(tree) if isinstance(t, ast.Try) and _catches_import_error(t)
                   for stmt in t.body for node in ast.walk(stmt)}
        for node in ast.walk(tree):
            if id(node) in guarded:
                continue
            if isinstance(node, ast.Import):
                yield from (Import(path, node.lineno, alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                yield Import(path, node.lineno, node.module)


def _catches_import_error(node: ast.Try) -> bool:
    names = set()
    for handler in node.handlers:
        if handler.type is None:
            return True
        kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        names.update(k.id for k in kinds if isinstance(k, ast.Name))
    return bool(names & {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"})


def _local(top: str, module_path: list[Path]) -> bool:
    return any((d / top).is_dir() or (d / f"{top}.py").is_file() for d in module_path)


# -- the build's entry module --------------------------------------------------------------------

def entry_module(modules: list[str], recompile: list[Path], mounts: dict[Path, str]) -> str:
    """Source of the module componentize-py builds from: it imports ``modules`` (so they are in the snapshot),
    parses ``recompile`` (the files the host could not) with the guest's parser and imports what those
    import where it can, then takes ``WitWorld`` from ``app``.

    componentize-py mounts module path entry i at /i/ (``mounts``: folder -> that prefix).
    """
    guest_paths = []
    for path in recompile:
        folder = next(f for f in mounts if path.is_relative_to(f))
        guest_paths.append(mounts[folder] + path.relative_to(folder).as_posix())
    source = ['"""The entry of an oven build: what the inferlet needs at run time is imported now."""']
    source += [f"import {module}" for module in modules]
    if guest_paths:
        source += ["import ast as _ast", f"for _path in {guest_paths!r}:",
                   "    with open(_path, 'rb') as _file:",
                   "        _tree = _ast.parse(_file.read(), _path)",
                   "    for _node in _ast.walk(_tree):",
                   "        _names = ([a.name for a in _node.names] if isinstance(_node, _ast.Import) else [_node.module]",
                   "                  if isinstance(_node, _ast.ImportFrom) and _node.level == 0 else [])",
                   "        for _name in _names:",
                   "            try:",
                   "                __import__(_name)",
                   "            except ImportError:",
                   "                pass"]
    source.append("from app import WitWorld  # noqa: F401 - the inferlet itself")
    # Everything made so far is in the snapshot every instance starts from: frozen, it is left out of the
    # collections an instance makes, which otherwise walked it (text-completion: about 35% less CPU per
    # launch; its memory the same).
    source += ["import gc as _gc", "_gc.collect()", "_gc.freeze()"]
    return "\n".join(source) + "\n"


def imported_modules(folder: Path, skip: set[Path]) -> list[str]:
    """Every module the folder's files import (unguarded, absolute), in order of first appearance."""
    return list(dict.fromkeys(imp.module for imp in _imports(folder, skip)))


_GUEST_SYNTAX = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)\n(?P<text>    .*\n)(?P<caret> +\^+ *\n)?'
                           r'SyntaxError: (?P<msg>.*)')


def guest_syntax_error(output: str, unmount, shown) -> str | None:
    """The last SyntaxError in componentize-py's output as file:line:col, or None if there is none.

    ``unmount`` maps a guest path to the host's file. The guest shows the line without its
    indentation, the caret under it: the column is counted again on the file's own line.
    """
    found = None
    for found in _GUEST_SYNTAX.finditer(output):
        pass
    if found is None:
        return None
    path, line = unmount(found["file"]), int(found["line"])
    try:
        text = path.read_text().splitlines()[line - 1]
    except (OSError, IndexError, UnicodeDecodeError):
        text = found["text"][4:].rstrip("\n")
    col = None
    if found["caret"]:
        caret_at = len(found["caret"]) - len(found["caret"].lstrip(" ")) - 4
        col = caret_at + (len(text) - len(text.lstrip())) + 1
    return syntax_message(shown(path), line, col, found["msg"].strip(), text)
