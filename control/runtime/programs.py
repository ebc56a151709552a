"""Inferlet programs, content-addressed, with compiled code cached on disk.

A program is a WebAssembly component identified by the SHA-256 of its bytes.
Compiling a Python component takes seconds, so the compiled form
(``Component.serialize``) is kept beside the ``.wasm``; a warm launch only
deserializes it (tens of milliseconds, once per process) and then reuses the
in-memory component.

A compiled file is native code that wasmtime maps and runs without checks, so
the store loads only what it wrote itself: each ``.cwasm`` carries an HMAC,
under a key that never leaves the store's private (0700) directory, of the
program's digest, the wasmtime version, the engine settings and the code.
A file that fails the check is ignored and the program compiled again.

Programs are addressed by digest (64 hex digits) or by a name; a name is never
a path. Names belong to the client that gave them: each client has its own
namespace, and the shared library (``LIBRARY``), which only an operator writes,
is visible to all. A client may launch a digest it uploaded or one the library
names. Nothing is written for an upload that fails to compile.
"""

from __future__ import annotations

import hashlib
import hmac
import importlib.metadata
import json
import logging
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

import wasmtime
from wasmtime import component

from oven.proto.auth import OPERATOR, private_dir, write_atomically, write_private_file

log = logging.getLogger(__name__)

WASM_MAGIC = b"\x00asm"
DIGEST = re.compile(r"^[0-9a-f]{64}$")
PROGRAM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
LIBRARY = ""  # the namespace of shared programs
MAX_NAMES_PER_CLIENT = 1024  # program names in one namespace (names.json is rewritten whole on each change)
# What one client may keep stored (the operator exempt); past it an upload of a new program is refused
# until the client removes some (RemoveProgram), so the disk every client shares cannot be filled by one.
MAX_PROGRAMS_PER_CLIENT = 256
MAX_STORED_BYTES_PER_CLIENT = 4 << 30
_CWASM_MAGIC = b"oven-cwasm-1\n"


class ProgramError(ValueError):
    pass


@dataclass(frozen=True)
class Compiled:
    """A program compiled and not yet stored: its digest, bytes, component and serialized code."""
    digest: str
    wasm: bytes
    component: component.Component
    code: bytes


def engine_config() -> wasmtime.Config:
    """One wasmtime configuration for every program (the compile cache key depends on it)."""
    cfg = wasmtime.Config()
    cfg.epoch_interruption = True  # a spinning inferlet is stopped at its slice deadline
    cfg.cranelift_opt_level = "speed"
    # Linear memories are wasmtime's default: each reserves 4 GiB and guard pages of address space, so the
    # guest's code needs no bounds checks (small, movable reservations made it 2.5-3.5x slower). What
    # they grow into is capped by the runner's RLIMIT_DATA and its client's share (control/runner/memory.py).
    return cfg


ENGINE_SETTINGS = "epoch+speed+default-memories"
WASMTIME_VERSION = importlib.metadata.version("wasmtime")


def check_name(name: str) -> None:
    if not PROGRAM_NAME.match(name) or DIGEST.match(name):
        raise ProgramError(f"a program name is 1-64 of A-Z a-z 0-9 . _ - (not starting with . _ -, and not 64 hex "
                           f"digits); not {name!r}")


class ProgramStore:
    """Uploaded programs under ``root``: ``<hash>.wasm``, ``<hash>.cwasm``, ``names.json``, ``code.key``."""

    def __init__(self, root: Path, engine: wasmtime.Engine):
        self.root = private_dir(Path(root))
        self.engine = engine
        self._components: dict[str, component.Component] = {}
        self._key = self._code_key()
        self._names_file = self.root / "names.json"
        self._names: dict[str, dict[str, str]] = {}  # namespace -> name -> digest
        self._uploaders: dict[str, list[str]] = {}  # digest -> clients that uploaded it
        if self._names_file.exists():
            self._load_names(json.loads(self._names_file.read_text()))

    def _code_key(self) -> bytes:
        path = self.root / "code.key"
        if not path.exists():
            write_private_file(path, secrets.token_hex(32))
        return bytes.fromhex(path.read_text().strip())

    def _load_names(self, saved: dict) -> None:
        if "namespaces" not in saved:  # the format before namespaces, written by anyone: the operator's now
            saved = {"namespaces": {OPERATOR: saved}, "uploaders": {d: [OPERATOR] for d in saved.values()}}
        self._names = {ns: dict(names) for ns, names in saved["namespaces"].items()}
        self._uploaders = {d: list(who) for d, who in saved["uploaders"].items()}

    def _save_names(self) -> None:
        write_private_file(self._names_file, json.dumps({"namespaces": self._names, "uploaders": self._uploaders},
                                                        indent=1, sort_keys=True))

    # -- adding ---------------------------------------------------------------------------------

    def add(self, wasm: bytes, name: str | None = None, *, uploader: str = OPERATOR,
            namespace: str | None = None) -> str:
        """Store a component for ``uploader``; return its hash. Compiles first, so a bad upload fails
        here, leaving nothing on disk, not at launch. ``name`` goes in ``namespace`` (default: the
        uploader's own)."""
        self.check_name_room(uploader if namespace is None else namespace, name)
        digest = hashlib.sha256(wasm).hexdigest()
        if self.has(digest):
            self.record_upload(digest, name, uploader=uploader, namespace=namespace)
            return digest
        return self.add_compiled(self.compile(wasm), name, uploader=uploader, namespace=namespace)

    def compile(self, wasm: bytes) -> Compiled:
        """Check and compile ``wasm`` (seconds for a Python inferlet). It reads and writes nothing of
        the store, so a server runs it off its loop thread and then calls :meth:`add_compiled`."""
        if not wasm.startswith(WASM_MAGIC):
            raise ProgramError("not a WebAssembly binary (bad magic number)")
        try:
            comp = component.Component(self.engine, wasm)
        except wasmtime.WasmtimeError as exc:
            raise ProgramError(f"not a valid component: {_first_line(exc)}") from None
        return Compiled(hashlib.sha256(wasm).hexdigest(), wasm, comp, comp.serialize())

    def add_compiled(self, compiled: Compiled, name: str | None = None, *, uploader: str = OPERATOR,
                     namespace: str | None = None) -> str:
        """Store what :meth:`compile` made, as :meth:`add` does; return its hash."""
        self.check_name_room(uploader if namespace is None else namespace, name)
        digest = compiled.digest
        if self.has(digest):
            self.record_upload(digest, name, uploader=uploader, namespace=namespace)
            return digest
        files = (self._compiled_path(digest), self.root / f"{digest}.wasm")  # only a program that compiled
        try:
            self._write_compiled(digest, compiled.code)
            _atomic_write(files[1], compiled.wasm)
            self.record_upload(digest, name, uploader=uploader, namespace=namespace)
        except BaseException:  # a full disk: none of its files stays, where no client's quota would count them
            for path in files:
                path.unlink(missing_ok=True)
            raise
        self._components[digest] = compiled.component
        return digest

    def record_upload(self, digest: str, name: str | None = None, *, uploader: str = OPERATOR,
                      namespace: str | None = None) -> None:
        """``uploader`` has the bytes of stored program ``digest`` (it sent them): it may launch it,
        and ``name`` names it in ``namespace``."""
        namespace = uploader if namespace is None else namespace
        self.check_name_room(namespace, name)
        before = ({ns: dict(table) for ns, table in self._names.items()},
                  {d: list(who) for d, who in self._uploaders.items()})
        changed = False
        if uploader not in self._uploaders.setdefault(digest, []):
            self._uploaders[digest].append(uploader)
            changed = True
        names = self._names.setdefault(namespace, {})
        if name and names.get(name) != digest:
            names[name] = digest
            changed = True
        if changed:
            try:
                self._save_names()
            except BaseException:  # not saved (a full disk): not taken either
                self._names, self._uploaders = before
                raise

    def check_name_room(self, namespace: str, name: str | None) -> None:
        """ProgramError unless ``name`` may name a program in ``namespace``: a valid name, and a new one
        only below MAX_NAMES_PER_CLIENT (every name is rewritten to disk with each change)."""
        if not name:
            return
        check_name(name)
        names = self._names.get(namespace, {})
        if name not in names and len(names) >= MAX_NAMES_PER_CLIENT:
            raise ProgramError(f"{MAX_NAMES_PER_CLIENT} program names are taken in {namespace!r} already; "
                               "name this one like an earlier one, or upload it without a name")

    def forget_client(self, client: str) -> None:
        """Forget ``client``'s names and that it uploaded anything (a removed client): whoever is given
        its name later starts with nothing. The programs stay stored."""
        changed = self._names.pop(client, None) is not None
        for uploaders in self._uploaders.values():
            if client in uploaders:
                uploaders.remove(client)
                changed = True
        if changed:
            self._save_names()

    def remove(self, digest: str, client: str) -> bool:
        """``client`` forgets stored program ``digest``: its names for it and its upload (the operator's
        removal: every client's names, the library's and uploads). The files go once no client has
        uploaded or names it (a running instance keeps its code in memory); True if they went."""
        for namespace in (list(self._names) if client == OPERATOR else [client]):
            table = self._names.get(namespace, {})
            for name in [name for name, d in table.items() if d == digest]:
                del table[name]
        uploaders = self._uploaders.get(digest, [])
        uploaders[:] = [] if client == OPERATOR else [who for who in uploaders if who != client]
        gone = not uploaders and not any(digest in table.values() for table in self._names.values())
        if gone:
            self._uploaders.pop(digest, None)
            self._components.pop(digest, None)
            for path in (self._compiled_path(digest), self.root / f"{digest}.wasm"):
                path.unlink(missing_ok=True)
        self._save_names()
        return gone

    def holds(self, digest: str, client: str) -> bool:
        """Whether ``client`` uploaded ``digest`` or names it (what its removal would take away)."""
        return client in self._uploaders.get(digest, ()) or digest in self._names.get(client, {}).values()

    def check_room_for(self, client: str, num_bytes: int) -> None:
        """ProgramError unless ``client`` may store one more program of ``num_bytes`` (MAX_PROGRAMS_PER_CLIENT,
        MAX_STORED_BYTES_PER_CLIENT; the operator exempt)."""
        if client == OPERATOR:
            return
        mine = [p for p in self.root.glob("*.wasm") if client in self._uploaders.get(p.stem, ())]
        stored = sum(p.stat().st_size for p in mine)
        if len(mine) >= MAX_PROGRAMS_PER_CLIENT or stored + num_bytes > MAX_STORED_BYTES_PER_CLIENT:
            raise ProgramError(f"this client stores {len(mine)} programs ({stored / 2**20:.1f} MiB; at most "
                               f"{MAX_PROGRAMS_PER_CLIENT} and {MAX_STORED_BYTES_PER_CLIENT >> 20} MiB): remove "
                               "some first (oven ps --programs --drop PROGRAM)")

    # -- finding --------------------------------------------------------------------------------

    def resolve(self, ref: str, client: str = OPERATOR) -> str:
        """The digest ``client`` means by ``ref``: one of its names, a library name, or a digest it may run."""
        if DIGEST.match(ref):
            if self.has(ref) and (client == OPERATOR or self.may_run(ref, client)):
                return ref
        elif PROGRAM_NAME.match(ref):
            digest = self._names.get(client, {}).get(ref) or self._names.get(LIBRARY, {}).get(ref)
            if digest is not None and self.has(digest):
                return digest
        else:
            raise ProgramError(f"{ref[:80]!r} is not a program name or a SHA-256 (a name is never a path)")
        raise ProgramError(f"no program named or hashed {ref!r}")

    def name_of(self, digest: str, client: str) -> str | None:
        """A name ``client`` knows program ``digest`` by (its own first, then the library's), or None."""
        for namespace in (client, LIBRARY):
            names = sorted(name for name, d in self._names.get(namespace, {}).items() if d == digest)
            if names:
                return names[0]
        return None

    def launch_name(self, ref: str, digest: str, client: str) -> str:
        """The name an instance ``client`` launches by ``ref`` goes by (:meth:`shown_name`): ``ref``, or for
        a hash (how ``oven run`` launches what it uploads) the name the client knows it by now, or ""."""
        return (self.name_of(digest, client) or "") if DIGEST.match(ref) else ref

    def shown_name(self, digest: str, launched_as: str, client: str) -> str:
        """How ``oven ps`` names ``client``'s instance of ``digest``, launched as ``launched_as``: that name
        while it still means this program to the client; ``library:NAME`` when it is the library's NAME
        and the client's own NAME is another program now; ``NAME@HASH`` (the hash's start, as in
        instance ids) for an earlier upload the name has moved on from; else a name the client knows it
        by, or the start of its hash."""
        if launched_as:
            own, library = self._names.get(client, {}).get(launched_as), self._names.get(LIBRARY, {}).get(launched_as)
            if (own or library) == digest:
                return launched_as
            return f"library:{launched_as}" if library == digest else f"{launched_as}@{digest[:8]}"
        return self.name_of(digest, client) or digest[:12]

    def may_run(self, digest: str, client: str) -> bool:
        return client in self._uploaders.get(digest, ()) or digest in self._names.get(LIBRARY, {}).values()

    def has(self, digest: str) -> bool:
        return bool(DIGEST.match(digest)) and (self.root / f"{digest}.wasm").exists()

    def entries(self, client: str = OPERATOR) -> list[tuple[str, list[str], int]]:
        """(hash, names, size in bytes) of every program ``client`` may run, with its own and library names
        (library names marked ``library:``); an operator sees every program and every name."""
        operator = client == OPERATOR
        names: dict[str, list[str]] = {}
        for namespace, table in sorted(self._names.items()):
            if operator or namespace in (client, LIBRARY):
                prefix = "library:" if namespace == LIBRARY else (f"{namespace}:" if operator else "")
                for name, digest in sorted(table.items()):
                    names.setdefault(digest, []).append(prefix + name)
        return sorted((p.stem, names.get(p.stem, []), p.stat().st_size) for p in self.root.glob("*.wasm")
                      if DIGEST.match(p.stem) and (operator or self.may_run(p.stem, client)))

    def component(self, digest: str) -> component.Component:
        """The compiled component: from memory, else :meth:`load` now (for the library and tests; a server
        loads off its loop thread, see control/program_requests.py)."""
        comp = self.loaded(digest)
        return comp if comp is not None else self.keep(digest, self.load(digest))

    def loaded(self, digest: str) -> component.Component | None:
        """The component if it is in memory (a launch can start at once), else None."""
        return self._components.get(digest)

    def load(self, digest: str) -> component.Component:
        """The component from the store's own compiled file, else compiled now (seconds: a compiled file
        from another wasmtime build is unusable) and its compiled file written. It changes nothing in
        memory, so a server runs it off its loop thread and then calls :meth:`keep`."""
        if not self.has(digest):
            raise ProgramError(f"no program hashed {digest!r}")
        comp = self._read_compiled(digest)
        if comp is None:
            try:
                comp = component.Component(self.engine, (self.root / f"{digest}.wasm").read_bytes())
            except wasmtime.WasmtimeError as exc:
                raise ProgramError(f"not a valid component: {_first_line(exc)}") from None
            self._write_compiled(digest, comp.serialize())
        return comp

    def keep(self, digest: str, comp: component.Component) -> component.Component:
        """Keep what :meth:`load` returned in memory, for every later launch."""
        self._components[digest] = comp
        return comp

    # -- compiled code --------------------------------------------------------------------------

    def _compiled_path(self, digest: str) -> Path:
        return self.root / f"{digest}.{WASMTIME_VERSION}-{ENGINE_SETTINGS}.cwasm"

    def _tag(self, digest: str, code: bytes) -> bytes:
        mac = hmac.new(self._key, digestmod=hashlib.sha256)
        for part in (digest.encode(), WASMTIME_VERSION.encode(), ENGINE_SETTINGS.encode()):
            mac.update(len(part).to_bytes(4, "little") + part)
        mac.update(code)
        return mac.digest()

    def _write_compiled(self, digest: str, code: bytes) -> None:
        _atomic_write(self._compiled_path(digest), _CWASM_MAGIC + self._tag(digest, code) + code)

    def _read_compiled(self, digest: str) -> component.Component | None:
        """The component from its compiled file if this store wrote it (the HMAC checks), else None."""
        path = self._compiled_path(digest)
        if not path.exists():
            return None
        blob = path.read_bytes()
        header = len(_CWASM_MAGIC) + 32
        if not blob.startswith(_CWASM_MAGIC) or not hmac.compare_digest(blob[len(_CWASM_MAGIC):header],
                                                                        self._tag(digest, blob[header:])):
            log.warning("ignoring %s: not compiled by this store (its HMAC does not check); compiling again",
                        path.name)
            return None
        try:
            return component.Component.deserialize(self.engine, blob[header:])
        except wasmtime.WasmtimeError as exc:  # written by another wasmtime build: compile again
            log.warning("recompiling %s: cached code unusable (%s)", digest[:12], _first_line(exc))
            return None


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _atomic_write(path: Path, data: bytes) -> None:
    """``path`` holds ``data`` whole or is as it was: on a failure (a full disk) no temporary file stays."""
    write_atomically(path, data, 0o600, path.name + f".tmp{os.getpid()}")
