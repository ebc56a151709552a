"""Where a client finds its server and its token, as ``oven`` verbs do without flags: the endpoint from
``OVEN_CONTROL_ENDPOINT``, else the socket ``oven serve`` makes in its state directory
(``OVEN_STATE_DIR``, else ``$OVEN_CACHE_DIR/server``, else ``~/.cache/oven/server``); the token from
``OVEN_TOKEN``, else the operator's token that server wrote there. (The CLI also reads a config file's
``[control]`` table, client/connect.py.)
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import zmq

from oven.proto.auth import AuthError, Token, default_state_dir


def client_state_dir() -> Path:
    """``OVEN_STATE_DIR``, else this user's default state directory (where ``oven serve`` keeps its socket
    and the operator's token unless told otherwise)."""
    return Path(os.environ["OVEN_STATE_DIR"]) if os.environ.get("OVEN_STATE_DIR") else default_state_dir()


def default_endpoint() -> str:
    """``OVEN_CONTROL_ENDPOINT``, else the socket in the state directory (:func:`client_state_dir`)."""
    return os.environ.get("OVEN_CONTROL_ENDPOINT") or f"ipc://{client_state_dir() / 'control.sock'}"


@contextmanager
def malformed_endpoint(endpoint: str) -> Iterator[None]:
    """Around a ZeroMQ connect: its refusal of a malformed ``endpoint`` becomes a ValueError naming it."""
    try:
        yield
    except zmq.ZMQError as exc:
        raise ValueError(f"bad endpoint {endpoint!r}: {os.strerror(exc.errno)} (expected ipc://PATH or "
                         "tcp://HOST:PORT)") from None


def find_token(explicit: str | None = None, state_dir: Path | None = None) -> Token:
    """The token to connect with: ``explicit`` or ``OVEN_TOKEN`` (a token, or @FILE holding one), else the
    operator token a server of this user wrote into its state directory (default: :func:`client_state_dir`).
    Raises :class:`AuthError` naming what is missing or unreadable."""
    text = explicit or os.environ.get("OVEN_TOKEN")
    source = "the token given"
    if not text:
        path = (state_dir or client_state_dir()) / "operator.token"
        if not path.exists():
            raise AuthError(f"no token: none given (--token, OVEN_TOKEN) and no {path} (a server started by this "
                            "user writes it; another user's server gives tokens with `oven token add NAME`)")
        text, source = path.read_text(), str(path)
    if text.startswith("@"):
        source = text[1:].strip()
        try:
            text = Path(source).read_bytes().decode(errors="replace")  # a binary file: "not an oven token" below
        except OSError as exc:
            raise AuthError(f"cannot read the token from {source}: {exc.strerror}") from None
    try:
        return Token.parse(text)
    except AuthError as exc:
        raise AuthError(f"{source}: {exc}") from None
