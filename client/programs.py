"""What ``oven run X``, ``oven upload X`` and ``OvenClient.launch(X)`` mean by X.

In order: a ``.wasm`` file; an inferlet folder (its built component, if it is built and newer than
its sources); an inferlet of the library by name (``inferlets/NAME/NAME.wasm``); otherwise a
program the server knows by that name (the client's own, else the shared library's) or SHA-256.
The first three are uploaded under their name (the server keeps one copy of a program and answers
an upload of one it holds at once) and launched by their digest, so what runs is the component on
this machine. What is none of these is said with the closest names.
"""

from __future__ import annotations

import difflib
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .build import BuildError, Inferlet, shown_path
from .paths import inferlets_dir

if TYPE_CHECKING:
    from .rpc import OvenClient

OnUpload = Callable[[str, int], None]  # (name, size in bytes): told before uploading a program the server lacks


class ProgramNotFound(LookupError):
    """The message is meant for the user as it is."""


@dataclass(frozen=True)
class LocalProgram:
    path: Path
    name: str  # the name it is uploaded under


def local_program(ref: str) -> LocalProgram | None:
    """The component on this machine that ``ref`` names, or None for a bare name the server may know.

    Raises :class:`ProgramNotFound` for a path that is not a built component, or a library inferlet
    that is not built.
    """
    path = Path(ref)
    if ref.endswith(".wasm"):
        if not path.is_file():
            raise ProgramNotFound(f"{ref}: no such file")
        if path.stat().st_size == 0:
            raise ProgramNotFound(f"{ref}: an empty file, not a component")
        return LocalProgram(path, path.stem)
    if path.is_dir():
        return _built(path, ref, fresh=True)
    if "/" in ref or ref.startswith("."):
        what = "not a .wasm component nor an inferlet folder" if path.exists() else "no such file or folder"
        raise ProgramNotFound(f"{ref}: {what}")
    library = inferlets_dir() / ref
    if library.is_dir():
        return _built(library, str(library), fresh=False)
    return None


def launchable(client: OvenClient, ref: str, on_upload: OnUpload | None = None) -> str:
    """What ``client`` launches for ``ref``: the SHA-256 of the local program ``ref`` names, uploaded now,
    or ``ref`` itself, for the server to resolve among its names. Raises :class:`ProgramNotFound` as
    :func:`local_program` does."""
    local = local_program(ref)
    return ref if local is None else upload_local(client, local, local.name, on_upload=on_upload)


def upload_local(client: OvenClient, program: LocalProgram, name: str, shared: bool = False,
                 on_upload: OnUpload | None = None) -> str:
    """Upload ``program`` as ``name``; its SHA-256. ``on_upload`` is told first if the server does not
    hold it yet (it will compile it: seconds, once per program)."""
    data = program.path.read_bytes()
    if on_upload is not None and hashlib.sha256(data).hexdigest() not in {p.sha256 for p in client.programs()}:
        on_upload(name, len(data))
    return client.upload(data, name, shared)


def library_program(name: str) -> LocalProgram:
    """A library inferlet's built component; raises :class:`ProgramNotFound` if it is missing or not built."""
    folder = inferlets_dir() / name
    if not folder.is_dir():
        raise ProgramNotFound(f"no inferlet {name!r} in {inferlets_dir()}")
    return _built(folder, str(folder), fresh=False)


def _built(folder: Path, shown: str, fresh: bool) -> LocalProgram:
    """The built component of the inferlet in ``folder``; ``fresh``: it must be newer than its sources (a
    folder the user names is one they edit; the library's are built by setup.sh)."""
    try:
        inferlet = Inferlet.at(folder)
    except BuildError as exc:
        raise ProgramNotFound(str(exc)) from None
    if not inferlet.output.is_file():
        raise ProgramNotFound(f"{shown} is not built yet: run `oven build {shown}`")
    if fresh and not inferlet.up_to_date():
        raise ProgramNotFound(f"{shown_path(inferlet.output)} is older than its sources: run `oven build {shown}`")
    return LocalProgram(inferlet.output, inferlet.name)


def library_names() -> list[str]:
    folder = inferlets_dir()
    return sorted(d.name for d in folder.iterdir() if d.is_dir()) if folder.is_dir() else []


def not_found(ref: str, server_names: list[str]) -> ProgramNotFound:
    """The error for a name that is nothing here nor on the server, with the closest names."""
    names = sorted(set(library_names()) | {n.split(":", 1)[-1] for n in server_names})
    close = difflib.get_close_matches(ref, names, n=3, cutoff=0.6)
    choices = ", ".join(close[:-1]) + " or " + close[-1] if len(close) > 1 else "".join(close)
    hint = f"; did you mean {choices}?" if close else " (`oven ps --programs` lists the server's)"
    return ProgramNotFound(f"no program {ref!r}: not a .wasm file, an inferlet folder, a library inferlet or a "
                           f"program uploaded to the server{hint}")
