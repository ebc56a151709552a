"""Binding a server's ZeroMQ endpoint so that no other process can take it first, or share it.

An ipc endpoint is a file path: in a directory other users may write (``/tmp``) another
user could bind it before the server does and receive what clients send, so a server
binds ipc only in a directory no one else may write. ZeroMQ itself would replace a
socket file that another live server listens on; :func:`bind` refuses instead, so two
servers never answer on one endpoint. A tcp port in use fails the bind.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
import tempfile
import time
from pathlib import Path

import zmq

from .auth import default_state_dir, private_dir

PRIVATE_PREFIX = "oven-endpoint-"
# A private folder this old is past its owner's bind (made just before it): an empty one, or one whose
# sockets refuse connections, was left by a process that was killed (SIGKILL leaves no time to clean).
STALE_AFTER_S = 600


class EndpointError(RuntimeError):
    pass


def private_endpoint() -> str:
    """A fresh ipc endpoint in a new temporary folder only this user may enter."""
    folder = tempfile.mkdtemp(prefix=PRIVATE_PREFIX)
    return f"ipc://{Path(folder) / 'inference.sock'}"


def sweep_stale_private_folders() -> int:
    """Remove this user's private endpoint folders that killed processes left in the temporary directory
    (see STALE_AFTER_S); how many. A socket that answers, or is too busy to, is never touched."""
    removed, now = 0, time.time()
    for folder in Path(tempfile.gettempdir()).glob(PRIVATE_PREFIX + "*"):
        try:
            info = folder.lstat()
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or now - info.st_mtime < STALE_AFTER_S:
                continue
            entries = list(folder.iterdir())
            if any(not entry.is_socket() or _ipc_listening(entry) for entry in entries):
                continue
            for entry in entries:
                entry.unlink()
            folder.rmdir()
            removed += 1
        except OSError:  # gone meanwhile, or not ours to remove
            continue
    return removed


def default_inference_endpoint() -> str:
    """Where a stand-alone ``oven inference`` listens unless told: in the user's private state directory."""
    return f"ipc://{private_dir(default_state_dir()) / 'inference.sock'}"


def ipc_path(endpoint: str) -> Path | None:
    return Path(endpoint.removeprefix("ipc://")) if endpoint.startswith("ipc://") else None


def check_bindable(endpoint: str) -> None:
    """Raise :class:`EndpointError` unless ``endpoint`` can be bound safely now (see the module doc)."""
    path = ipc_path(endpoint)
    if path is None:
        return
    folder = path.parent
    try:
        info = folder.stat()
    except FileNotFoundError:
        raise EndpointError(f"cannot serve on {endpoint}: {folder} does not exist") from None
    if info.st_uid != os.getuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise EndpointError(f"cannot serve on {endpoint}: {folder} is writable by other users, who could bind it "
                            "first; use a path in a directory only you may write")
    if path.exists():
        if _ipc_listening(path):
            raise EndpointError(f"cannot serve on {endpoint}: another server is listening there")
        path.unlink()  # a socket file left by a server that died


def bind(sock: zmq.Socket, endpoint: str) -> None:
    """``sock.bind(endpoint)`` after :func:`check_bindable`; a port in use is an :class:`EndpointError` too."""
    check_bindable(endpoint)
    try:
        sock.bind(endpoint)
    except zmq.ZMQError as exc:
        reason = "the address is in use" if exc.errno == errno.EADDRINUSE else str(exc)
        raise EndpointError(f"cannot serve on {endpoint}: {reason}") from None


def listening(endpoint: str, timeout_s: float = 1.0) -> bool:
    """Does a server listen at ``endpoint`` (ipc or tcp)? A quick look for clients, before any handshake:
    a missing socket file or a refused port is said at once, not after a request's timeout."""
    path = ipc_path(endpoint)
    if path is not None:
        return _ipc_listening(path)
    if endpoint.startswith("tcp://"):
        host, _, port = endpoint.removeprefix("tcp://").rpartition(":")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
                return True
        except (OSError, ValueError):
            return False
    return True  # another transport (inproc): let the request find out


def _ipc_listening(path: Path) -> bool:
    """Someone listens on socket file ``path``: it accepts, or its backlog is full (a blocking probe
    would wait on a busy server)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.setblocking(False)
    try:
        probe.connect(str(path))
        return True
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        probe.close()
