"""Client side of the inference protocol: a DEALER socket that speaks :data:`oven.proto.inference.CODEC`.

Requests may be pipelined: :meth:`InferenceClient.send` returns the request id
at once and :meth:`InferenceClient.recv` yields replies as they come, with
idle notices counted on the side; :meth:`InferenceClient.call` is the
blocking round trip built on the two.
"""

from __future__ import annotations

import itertools

import zmq

from oven.proto import inference as p
from oven.proto.auth import Token, secure_client


class InferenceError(RuntimeError):
    """The server rejected a whole request (an :class:`ErrorReply`)."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code


class InferenceClient:
    def __init__(self, endpoint: str, timeout_s: float = 600.0, token: Token | None = None):
        """``token``: the server's key and ours, for a server that admits only us (one we started)."""
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self._sock = zmq.Context.instance().socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        if token is not None:
            secure_client(self._sock, token)
        self._sock.connect(endpoint)
        self._ids = itertools.count(1)
        self._early: dict[int, object] = {}  # replies that arrived while waiting for another
        self._unanswered: set[int] = set()
        self.num_idle_notices = 0
        # True once the server said it is idle after answering everything we sent; a notice
        # that overtakes our latest request (sent before the server saw it) does not count.
        self.server_idle = True

    def send(self, request) -> int:
        request_id = next(self._ids)
        self._sock.send(p.CODEC.encode(request, request_id))
        self._unanswered.add(request_id)
        self.server_idle = False
        return request_id

    def send_raw(self, payload: bytes) -> None:
        """Send bytes as they are (for tests of malformed input)."""
        self._sock.send(payload)

    def _next(self, timeout_s: float | None) -> tuple[int, object] | None:
        """One message off the socket: (request_id, reply), or None for an idle notice."""
        if not self._sock.poll(int(1000 * (self.timeout_s if timeout_s is None else timeout_s))):
            raise TimeoutError(f"no message from the inference server at {self.endpoint}")
        return self._read()

    def _read(self) -> tuple[int, object] | None:
        envelope = p.CODEC.decode(self._sock.recv())
        if isinstance(envelope.message, p.IdleNotice):
            self.num_idle_notices += 1
            self.server_idle = not self._unanswered
            return None
        self._unanswered.discard(envelope.request_id)
        return envelope.request_id, envelope.message

    @property
    def socket(self) -> zmq.Socket:
        """The DEALER socket, for callers that poll several sockets at once."""
        return self._sock

    def try_recv(self) -> tuple[int, object] | None:
        """A reply that has already arrived, or None (idle notices are counted and skipped)."""
        # One getsockopt per check (Socket.poll(0) builds a Poller, and _next would poll again).
        while self._sock.get(zmq.EVENTS) & zmq.POLLIN:
            message = self._read()
            if message is not None:
                return message
        return None

    def recv(self, timeout_s: float | None = None) -> tuple[int, object]:
        """Next (request_id, reply), skipping idle notices; TimeoutError when none comes in time."""
        while True:
            message = self._next(timeout_s)
            if message is not None:
                return message

    def wait_idle(self, timeout_s: float | None = None) -> None:
        """Block until the server reports idle (replies that arrive meanwhile are kept for :meth:`wait`)."""
        while not self.server_idle:
            message = self._next(timeout_s)
            if message is not None:
                self._early[message[0]] = message[1]

    def wait_reply(self, request_id: int, timeout_s: float | None = None):
        """The reply to ``request_id``, an ErrorReply included."""
        reply = self._early.pop(request_id, None)
        while reply is None:
            rid, message = self.recv(timeout_s)
            if rid == request_id:
                reply = message
            else:
                self._early[rid] = message
        return reply

    def wait(self, request_id: int, timeout_s: float | None = None):
        """The reply to ``request_id``; an ErrorReply raises :class:`InferenceError`."""
        reply = self.wait_reply(request_id, timeout_s)
        if isinstance(reply, p.ErrorReply):
            raise InferenceError(reply.code, reply.message)
        return reply

    def call(self, request, timeout_s: float | None = None):
        return self.wait(self.send(request), timeout_s)

    def info(self) -> p.InfoReply:
        return self.call(p.InfoRequest())

    def close(self) -> None:
        self._sock.close(0)

    def __enter__(self) -> "InferenceClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
