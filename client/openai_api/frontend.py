"""The OpenAI-compatible front end of ``oven serve --openai-port PORT``: a process of its own.

It is a client of the control server like any other, so the control loop never waits on HTTP: a
separate process shares no GIL with the loop (whose per-token overhead is measured in
microseconds), and a crash or a flood of connections there cannot stall batching. ``oven serve``
binds the port itself before the model loads, so an address in use fails at once, and hands the
listening socket to the child (:class:`FrontEnd`), which publishes the chat-completion inferlet to
the shared library with the operator's token, then serves with uvicorn until its parent goes (keeping
that token in memory for ``/health`` alone: requests use their own keys).
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from oven.proto.config_loader import setting
from oven.proto.lifeline import die_with_parent, lifeline_env

PROGRAM_NAME = "chat-completion"
# Times a front end that exits is started again before ``oven serve`` gives the API up (and closes its
# port, so that callers are refused at once instead of waiting on a socket nobody serves).
RESTARTS = 5
API_OFF = 3  # the front end's exit status when it could not publish its inferlet: starting it again would not help
# Connections served at once (uvicorn answers 503 past it): with the body cap (app.MAX_BODY_BYTES),
# what a flood of requests can make the front end hold. Connections that are slow to send a request are
# closed first (app.DeadlineH11Protocol).
MAX_CONNECTIONS = 256
log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class OpenAIConfig:
    """Settings of the OpenAI-compatible endpoint (``[openai]`` in a config file, ``OVEN_OPENAI_*``)."""

    openai_port: int = setting(0, "port of the OpenAI-compatible HTTP endpoint; 0 = off")
    openai_host: str = setting("127.0.0.1", "address it listens on; another address serves other machines too "
                                            "(every request needs a token)")

    def __post_init__(self) -> None:
        if not 0 <= self.openai_port <= 65535:
            raise ValueError(f"openai_port must be from 0 (off) to 65535, not {self.openai_port}")

    @property
    def url(self) -> str:
        host = f"[{self.openai_host}]" if ":" in self.openai_host else self.openai_host
        return f"http://{host}:{self.openai_port}/v1"


class FrontEndError(RuntimeError):
    pass


class FrontEnd:
    """The front end's process, seen from ``oven serve``: :meth:`bind` first, :meth:`start` once serving."""

    def __init__(self, config: OpenAIConfig, program: Path):
        self.config, self.program = config, program
        self.sock: socket.socket | None = None
        self.proc: subprocess.Popen | None = None
        self._args: tuple[str, str] = ("", "")  # (control endpoint, operator token), for a restart
        self._stopping, self._lock = False, threading.Lock()  # the lock orders a restart against stop()

    def bind(self) -> None:
        """Listen on the configured address now; raises :class:`FrontEndError` (one line) if it cannot."""
        family = socket.AF_INET6 if ":" in self.config.openai_host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.config.openai_host, self.config.openai_port))
            sock.listen(512)
        except OSError as exc:
            sock.close()
            reason = "the address is in use" if exc.errno == errno.EADDRINUSE else exc.strerror or str(exc)
            raise FrontEndError(f"cannot serve the OpenAI API on {self.config.url}: {reason}") from None
        self.sock = sock

    def start(self, endpoint: str, operator_token: str) -> None:
        """Start serving for the control server at ``endpoint``; a front end that exits is started again
        (RESTARTS times at most), its exit said on stderr."""
        self._args = (endpoint, operator_token)
        self._spawn()
        threading.Thread(target=self._watch, name="openai-front-end", daemon=True).start()

    def _spawn(self) -> None:
        endpoint, operator_token = self._args
        fd = self.sock.fileno()
        cmd = [sys.executable, "-m", "oven.client.openai_api.frontend", "--fd", str(fd), "--endpoint", endpoint,
               "--program", str(self.program), "--url", self.config.url]
        # A session of its own: a Ctrl-C at the terminal goes to `oven serve` alone, which stops it (and its
        # lifeline ends it if `oven serve` dies), instead of ending it first and being taken for a crash.
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, pass_fds=(fd,), start_new_session=True,
                                     env={**os.environ, "OVEN_TOKEN": operator_token, **lifeline_env()})

    def _watch(self) -> None:
        for restart in range(1, RESTARTS + 2):
            status = self.proc.wait()
            with self._lock:
                if self._stopping:
                    return
                if status == API_OFF or restart > RESTARTS:
                    why = "" if status == API_OFF else f" ({RESTARTS} restarts used)"
                    _say(f"the OpenAI API on {self.config.url} is off: its front end exited with status {status}{why}")
                    self.sock.close()
                    self.sock = None
                    return
                _say(f"the OpenAI front end exited with status {status}: starting it again ({restart} of {RESTARTS})")
                self._spawn()

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.sock is not None:
            self.sock.close()


def _say(message: str) -> None:
    print(f"oven: {message}", file=sys.stderr, flush=True)


def publish(endpoint: str, program: Path):
    """Put the chat-completion component in the server's shared library (as the operator, whose token is in
    ``OVEN_TOKEN``); (its digest, the models served, what one request may ask)."""
    from oven.client.rpc import OvenClient

    from .limits import Limits

    with OvenClient(endpoint) as client:
        digest = client.upload_file(program, PROGRAM_NAME, shared=True)
        info = client.info()
        return digest, info.models, Limits.of(info)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m oven.client.openai_api.frontend")
    parser.add_argument("--fd", type=int, required=True, help="a listening TCP socket to serve on")
    parser.add_argument("--endpoint", required=True, help="the control server")
    parser.add_argument("--program", type=Path, required=True, help="the built chat-completion component")
    parser.add_argument("--url", required=True, help="the address the socket listens on, to show")
    args = parser.parse_args(argv)
    die_with_parent()
    import uvicorn

    from .app import DeadlineH11Protocol, create_app

    try:
        digest, models, limits = publish(args.endpoint, args.program)
    except Exception as exc:  # noqa: BLE001 - said in one line; oven serve goes on without the API
        _say(f"the OpenAI API is off: {type(exc).__name__}: {exc}")
        return API_OFF
    operator_token = os.environ.pop("OVEN_TOKEN", "")  # out of the environment: requests use their own keys
    sock = socket.socket(fileno=args.fd)
    app = create_app(args.endpoint, digest, models, limits, operator_token)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                                           timeout_graceful_shutdown=5, limit_concurrency=MAX_CONNECTIONS,
                                           http=DeadlineH11Protocol))
    _say(f"OpenAI API on {args.url} (API key: an oven token: `oven token add NAME` prints one; the operator's "
         "is operator.token in the server's --state-dir)")
    server.run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())
