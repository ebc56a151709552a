"""Inferlet programs, content-addressed, with compiled code cached on disk.

A program is a WebAssembly component identified by the SHA-256 of its bytes.
Compiling a Python component takes seconds, so the compiled form
(``Component.serialize``) is kept next to the ``.wasm`` under a key that also
names the wasmtime version and the engine settings; a warm launch only
deserializes it (tens of milliseconds, once per process) and then reuses the
in-memory component.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import os
from pathlib import Path

import wasmtime
from wasmtime import component

log = logging.getLogger(__name__)

WASM_MAGIC = b"\x00asm"


class ProgramError(ValueError):
    pass


def engine_config() -> wasmtime.Config:
    """One wasmtime configuration for every program (the compile cache key depends on it)."""
    cfg = wasmtime.Config()
    cfg.epoch_interruption = True  # a spinning inferlet is stopped at its slice deadline
    cfg.cranelift_opt_level = "speed"
    return cfg


ENGINE_SETTINGS = "epoch+speed"
WASMTIME_VERSION = importlib.metadata.version("wasmtime")


class ProgramStore:
    """Uploaded programs under ``root``: ``<hash>.wasm``, ``<hash>.<wasmtime>-<settings>.cwasm``, names."""

    def __init__(self, root: Path, engine: wasmtime.Engine):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.engine = engine
        self._components: dict[str, component.Component] = {}
        self._names_file = self.root / "names.json"
        self._names: dict[str, str] = json.loads(self._names_file.read_text()) if self._names_file.exists() else {}

    def add(self, wasm: bytes, name: str | None = None) -> str:
        """Store a component; return its hash. Compiles now, so a bad upload fails here, not at launch."""
        if not wasm.startswith(WASM_MAGIC):
            raise ProgramError("not a WebAssembly binary (bad magic number)")
        digest = hashlib.sha256(wasm).hexdigest()
        path = self.root / f"{digest}.wasm"
        if not path.exists():
            _atomic_write(path, wasm)
        self.component(digest)
        if name:
            self.set_name(name, digest)
        return digest

    def set_name(self, name: str, digest: str) -> None:
        """Launch ``digest`` by ``name`` from now on (names persist across restarts)."""
        if self._names.get(name) != digest:
            self._names[name] = digest
            _atomic_write(self._names_file, json.dumps(self._names, indent=1).encode())

    def resolve(self, name_or_hash: str) -> str:
        digest = self._names.get(name_or_hash, name_or_hash)
        if not (self.root / f"{digest}.wasm").exists():
            raise ProgramError(f"no program named or hashed {name_or_hash!r}")
        return digest

    def has(self, digest: str) -> bool:
        return (self.root / f"{digest}.wasm").exists()

    def entries(self) -> list[tuple[str, list[str], int]]:
        """(hash, names, size in bytes) of every stored program."""
        names: dict[str, list[str]] = {}
        for name, digest in sorted(self._names.items()):
            names.setdefault(digest, []).append(name)
        return sorted((p.stem, names.get(p.stem, []), p.stat().st_size) for p in self.root.glob("*.wasm"))

    def component(self, digest: str) -> component.Component:
        """The compiled component: from memory, else from the on-disk cache, else compiled now."""
        cached = self._components.get(digest)
        if cached is not None:
            return cached
        compiled = self.root / f"{digest}.{WASMTIME_VERSION}-{ENGINE_SETTINGS}.cwasm"
        comp = None
        if compiled.exists():
            try:
                comp = component.Component.deserialize(self.engine, compiled.read_bytes())
            except wasmtime.WasmtimeError as exc:  # stale or corrupt cache: recompile
                log.warning("recompiling %s: cached code unusable (%s)", digest[:12], exc)
        if comp is None:
            try:
                comp = component.Component(self.engine, (self.root / f"{digest}.wasm").read_bytes())
            except wasmtime.WasmtimeError as exc:
                raise ProgramError(f"not a valid component: {exc}") from None
            _atomic_write(compiled, comp.serialize())
        self._components[digest] = comp
        return comp


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)
