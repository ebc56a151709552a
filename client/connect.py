"""How a CLI verb finds and reaches its oven server, the way ``oven serve`` finds where to listen.

The endpoint and the state directory (where a server started by this user keeps the operator's
token) come from the one config loader, as ``serve``'s do: ``--server``/``--token``, else
``OVEN_CONTROL_ENDPOINT``/``OVEN_STATE_DIR``/``OVEN_TOKEN``, else the ``[control]`` table of
``--config FILE`` (or ``OVEN_CONFIG``), else the defaults. A server that is not there is said at
once: nothing listens on the endpoint (checked before any token is needed), or it does not answer
within :data:`ANSWER_S`. A token itself on the command line is every local user's to read (``ps``
shows argv): it works, with a warning naming ``--token @FILE`` and ``OVEN_TOKEN``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from oven.control.config import ControlConfig
from oven.proto.auth import Token
from oven.proto.config_loader import config_from_args
from oven.proto.endpoints import ipc_path, listening, private_endpoint
from oven.proto.lifeline import lifeline_env, terminate

from .rpc import OvenClient, find_token

ANSWER_S = 2.0  # a listening server that does not answer this soon is said to be stuck
TOKEN_IN_ARGV = ("oven: warning: a token given on the command line is visible to every local user (ps); "
                 "pass --token @FILE, or set OVEN_TOKEN, instead")
EXIT_FAILURE, EXIT_USAGE = 1, 2


class NoServer(RuntimeError):
    pass


@dataclass(frozen=True)
class Target:
    endpoint: str
    explicit: bool  # named by a flag, the environment or a config file (not the default)
    state_dir: Path
    token_text: str | None

    def token(self) -> Token:
        """The token to connect with; raises AuthError naming what is missing."""
        return find_token(self.token_text, self.state_dir)

    def no_server(self) -> NoServer:
        return NoServer(f"no server answers at {self.endpoint} (start one with `oven serve`)")


def add_client_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--server", default=None, metavar="ENDPOINT",
                        help="control endpoint of a running `oven serve` (default: $OVEN_CONTROL_ENDPOINT, the "
                             "config file's control_endpoint, else this user's server, "
                             "ipc://$OVEN_CACHE_DIR/server/control.sock)")
    parser.add_argument("--token", default=None, metavar="@FILE",
                        help="a file holding the client token, as @FILE (the token itself works too, but every local "
                             "user can read a command line: `ps`); default: $OVEN_TOKEN (a token or @FILE), else the "
                             "operator token this user's server wrote")
    parser.add_argument("--config", type=Path, default=None, metavar="FILE",
                        help="the TOML file `oven serve` reads: its [control] table says where the server is "
                             "(default: $OVEN_CONFIG)")


def target_of(args: argparse.Namespace) -> Target:
    """Where ``args`` (a verb's parsed flags) point; ValueError for a bad setting."""
    control = config_from_args(ControlConfig, argparse.Namespace(config=args.config), section="control")
    explicit = bool(args.server or control.control_endpoint)
    return Target(args.server or control.endpoint, explicit, control.state_path, args.token)


@contextmanager
def client_of(target: Target, timeout_s: float = 30.0):
    """A client of the server at ``target``; raises :class:`NoServer` at once if it is not there."""
    if not listening(target.endpoint):
        raise target.no_server()
    with OvenClient(target.endpoint, timeout_s=timeout_s, token=target.token()) as client:
        if target.token_text is not None and not target.token_text.startswith("@"):
            print(TOKEN_IN_ARGV, file=sys.stderr, flush=True)
        try:
            client.info(timeout_s=ANSWER_S)
        except TimeoutError:
            raise target.no_server() from None
        yield client


class EmbeddedServer:
    """A private ``oven serve`` for one ``oven run``, stopped when the run ends (or dies with it)."""

    def __init__(self, model: str, state_dir: Path):
        self.endpoint, self.state_dir = private_endpoint(), state_dir
        cmd = [sys.executable, "-m", "oven.client.cli", "serve", "--model", model, "--quiet",
               "--control-endpoint", self.endpoint, "--state-dir", str(state_dir)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     env={**os.environ, **lifeline_env()})

    def client(self, timeout_s: float = 300.0) -> OvenClient:
        """A client of the server once it serves (its operator token is written before the model loads)."""
        deadline, client = time.monotonic() + timeout_s, None
        try:
            while client is None or not client.reachable(timeout_s=1.0):
                if self.proc.poll() is not None:
                    raise RuntimeError(f"the embedded server exited with status {self.proc.returncode}")
                if time.monotonic() > deadline:
                    raise TimeoutError("the embedded server did not come up")
                if client is None and (self.state_dir / "operator.token").exists():
                    client = OvenClient(self.endpoint, token=find_token(None, self.state_dir))
                elif client is None:
                    time.sleep(0.1)
        except BaseException:
            if client is not None:
                client.close()
            raise
        return client

    def stop(self) -> None:
        terminate(self.proc, 30)
        shutil.rmtree(ipc_path(self.endpoint).parent, ignore_errors=True)


@contextmanager
def embedded_server(model: str, state_dir: Path):
    """A client of a private server on ``model``, started here and stopped with the block."""
    server = EmbeddedServer(model, state_dir)
    try:
        with server.client() as client:
            yield client
    finally:
        server.stop()


@contextmanager
def connected(target: Target, model: str):
    """A client of the server at ``target``, or, when none listens at the default endpoint, of an
    embedded one started (and stopped) here."""
    if listening(target.endpoint) or target.explicit:
        with client_of(target) as client:
            yield client
        return
    say_embedded = (f"oven: no server answers; starting an embedded one on {model} (loading the model takes "
                    "about 15 s) ...")
    print(say_embedded, file=sys.stderr, flush=True)
    with embedded_server(model, target.state_dir) as client:
        yield client
