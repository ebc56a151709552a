"""Inference replicas on other hosts: ``oven inference --join KEYFILE`` there, ``oven serve
--remote-replicas ENDPOINT=TOKEN`` here.

The remote process admits one CurveZMQ key, whose secret half is in the token it prints; the
control side connects with that token, so no one else can use the process and nothing else can
answer for it. A remote replica is not this process's child: nothing here starts or kills it.
:class:`RemoteInference` stands where a local replica has its :class:`~.supervisor.InferenceSupervisor`:
its loss is seen at once when its TCP connection drops (a ZeroMQ socket monitor), or when a batch goes
unanswered for ``--inference-timeout-s``; the loop then ends the instances with state there, as
for a local replica, and :meth:`RemoteInference.restart` connects again and waits: the replica
serves again once a process answers there with the same model and pools (``--join`` with the same
KEYFILE keeps the keys, so a restarted remote admits this side again).
"""

from __future__ import annotations

import logging
from pathlib import Path

import zmq
from zmq.utils.monitor import recv_monitor_message

from oven.proto import inference as p
from oven.proto.auth import AuthError, Token

from .inference_client import InferenceClient

log = logging.getLogger(__name__)

CONNECT_S = 5.0  # a remote replica that does not answer at start within this is an error


def parse_remote_replicas(text: str) -> list[tuple[str, Token]]:
    """``ENDPOINT=TOKEN,...`` (a TOKEN is the token itself or @FILE holding it) as (endpoint, token)
    pairs; ValueError saying what is wrong."""
    replicas = []
    for entry in filter(None, (part.strip() for part in text.split(","))):
        endpoint, sep, token_text = entry.partition("=")
        if not sep or not endpoint.startswith("tcp://"):
            raise ValueError(f"remote replica {entry.split('=')[0]!r}: expected tcp://HOST:PORT=TOKEN "
                             "(TOKEN as `oven inference --join` printed it, or @FILE holding it)")
        if token_text.startswith("@"):
            try:
                token_text = Path(token_text[1:]).read_text()
            except OSError as exc:
                raise ValueError(f"remote replica {endpoint}: cannot read its token: {exc.strerror}") from None
        try:
            replicas.append((endpoint, Token.parse(token_text)))
        except AuthError as exc:
            raise ValueError(f"remote replica {endpoint}: {exc}") from None
    return replicas


class RemoteInference:
    """A connection to a remote inference process, with the supervisor's interface (:meth:`check`,
    :meth:`kill`, :meth:`restart`, :meth:`stop`). Connecting waits for its ``info`` at most
    ``timeout_s``: RuntimeError saying so when none comes."""

    def __init__(self, endpoint: str, token: Token, timeout_s: float = CONNECT_S):
        self.endpoint, self._token = endpoint, token
        self._client, self._monitor = self._connect()
        try:
            self._client.call(p.InfoRequest(), timeout_s=timeout_s)
        except TimeoutError:
            self.stop()
            self._client.close()
            raise RuntimeError(f"no inference process answers at {endpoint} within {timeout_s:g} s (is `oven "
                               "inference --join` running there, and is this its token?)") from None
        self._lost: str | None = None

    def _connect(self) -> tuple[InferenceClient, zmq.Socket]:
        client = InferenceClient(self.endpoint, token=self._token)
        return client, client.socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)

    def client(self) -> InferenceClient:
        return self._client

    def check(self, now: float) -> str | None:
        """Why the replica is lost, or None while it is connected."""
        while self._lost is None and self._monitor.poll(0):
            if recv_monitor_message(self._monitor)["event"] == zmq.EVENT_DISCONNECTED:
                self._lost = f"the connection to {self.endpoint} dropped (its process or host is gone)"
        return self._lost

    def kill(self, reason: str) -> None:
        """It stopped answering: count it lost (it is not ours to kill)."""
        self._lost = reason

    def restart(self, now: float) -> InferenceClient:
        """A new connection, which ZeroMQ keeps trying until a process answers there."""
        log.warning("inference replica at %s lost; waiting for it to come back", self.endpoint)
        self.stop()
        self._client, self._monitor = self._connect()
        self._lost = None
        return self._client

    def stop(self) -> None:
        self._client.socket.disable_monitor()
        self._monitor.close(0)
