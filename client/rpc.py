"""Python client of the control process: the verbs of the ``oven`` CLI as methods.

Every method is one round trip (uploads: one per chunk). :meth:`OvenClient.events`
yields the output of attached instances and keeps the client's lease alive.

The connection is a CurveZMQ session under the client's token (:func:`find_token`:
``--token``, ``OVEN_TOKEN``, or the operator's token that a server started by the
same user wrote). A server that refuses the token, or one that is not the server
the token names, raises :class:`AuthError` instead of leaving requests unanswered;
a server that restarted (a new ``server_id``) raises :class:`ServerRestarted`.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import time
import contextlib
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import zmq
from zmq.utils.monitor import recv_monitor_message

from oven.proto import control as c
from oven.proto.auth import AuthError, Token, default_control_endpoint, default_state_dir, secure_client


class ControlRequestError(RuntimeError):
    def __init__(self, error: c.ControlError):
        super().__init__(f"{error.code}: {error.message}")
        self.code = error.code


class ServerRestarted(RuntimeError):
    pass


def default_endpoint() -> str:
    """``OVEN_CONTROL_ENDPOINT``, else the socket of a server in this user's default state directory."""
    return os.environ.get("OVEN_CONTROL_ENDPOINT") or default_control_endpoint()


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
    operator token a server of this user wrote into its state directory (default: the default one)."""
    text = explicit or os.environ.get("OVEN_TOKEN")
    source = "the token given"
    if not text:
        path = (state_dir or default_state_dir()) / "operator.token"
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


class OvenClient:
    def __init__(self, endpoint: str | None = None, timeout_s: float = 60.0, token: Token | str | None = None):
        self.endpoint, self.timeout_s = endpoint or default_endpoint(), timeout_s
        self._sock = zmq.Context.instance().socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        try:
            self.token = token if isinstance(token, Token) else find_token(token)
            secure_client(self._sock, self.token)
            self._no_token = None
        except AuthError as exc:  # raised by the first request, so reachable() can say False
            self.token, self._no_token = None, exc
        self._monitor = self._sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                                                      | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
        self._poller = zmq.Poller()
        self._poller.register(self._sock, zmq.POLLIN)
        self._poller.register(self._monitor, zmq.POLLIN)
        with malformed_endpoint(self.endpoint):
            self._sock.connect(self.endpoint)
        self._ids = itertools.count(1)
        self._events: list[c.InstanceEvent] = []
        self._last_sent = time.monotonic()
        self.lease_s = c.DEFAULT_LEASE_S  # learnt from the server by info() / reachable()
        self.server_id: str | None = None  # learnt from the first info() or heartbeat

    def request(self, message, timeout_s: float | None = None):
        """Send one request and wait for its reply; a ControlError raises :class:`ControlRequestError`."""
        if self._no_token is not None:
            raise self._no_token
        request_id = next(self._ids)
        self._sock.send(c.CODEC.encode(message, request_id))
        self._last_sent = time.monotonic()
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        while True:
            remaining = deadline - time.monotonic()
            ready = dict(self._poller.poll(int(remaining * 1000))) if remaining > 0 else {}
            if self._monitor in ready:  # a refused handshake is said at once, not after the timeout
                self._raise_handshake_failure()
            if self._sock not in ready:
                if remaining <= 0:
                    raise TimeoutError(f"no reply from the oven server at {self.endpoint}")
                continue
            envelope = c.CODEC.decode(self._sock.recv())
            if isinstance(envelope.message, c.InstanceEvent):
                self._events.append(envelope.message)
            elif envelope.request_id == request_id:
                if isinstance(envelope.message, c.ControlError):
                    raise ControlRequestError(envelope.message)
                return envelope.message

    def _raise_handshake_failure(self) -> None:
        """Say why a server did not answer, if the CURVE handshake is why."""
        while self._monitor.poll(0):
            event = recv_monitor_message(self._monitor)["event"]
            if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                raise AuthError(f"the server at {self.endpoint} refused this client's token")
            # A server that cannot read our hello (it has another key) just hangs up.
            raise AuthError(f"the server at {self.endpoint} is not the server this token was made for")

    def reachable(self, timeout_s: float = 1.0) -> bool:
        try:
            self.info(timeout_s)
            return True
        except (TimeoutError, AuthError):
            return False

    def upload(self, wasm: bytes, name: str = "", shared: bool = False, busy_wait_s: float = 60.0) -> str:
        """Store ``wasm`` (named ``name`` among this client's programs, or the library's if ``shared``).
        A chunk refused ``upload_busy`` (the server's upload buffers or compile slots are full; it keeps
        what it took) is sent again after a pause, for up to ``busy_wait_s`` in all."""
        if not wasm:  # no chunk to send: the server would store nothing, yet the digest would look like success
            raise ValueError("the program is empty")
        digest = hashlib.sha256(wasm).hexdigest()
        give_up, pause = time.monotonic() + busy_wait_s, 0.5
        for offset in range(0, len(wasm), c.UPLOAD_CHUNK_BYTES):
            chunk = wasm[offset:offset + c.UPLOAD_CHUNK_BYTES]
            while True:
                try:
                    reply = self.request(c.UploadChunk(name, digest, len(wasm), offset, chunk, shared), timeout_s=300)
                    break
                except ControlRequestError as exc:
                    if exc.code != "upload_busy" or time.monotonic() + pause > give_up:
                        raise
                    time.sleep(pause)
                    pause = min(2 * pause, 5.0)
            if reply.complete:
                break
        return digest

    def upload_file(self, path: Path, name: str = "", shared: bool = False) -> str:
        return self.upload(Path(path).read_bytes(), name, shared)

    def launch(self, program: str, args: list[str], detach: bool = False) -> str:
        self._know_server()
        # a program whose code the server must compile again (a new wasmtime) is answered after seconds
        return self.request(c.Launch(program, list(args), detach), timeout_s=300).instance_id

    def programs(self) -> list[c.ProgramEntry]:
        return self.request(c.ListPrograms()).programs

    def instances(self) -> list[c.InstanceEntry]:
        return self.request(c.ListInstances()).instances

    def send(self, instance_id: str, text: str) -> None:
        self.request(c.SendMessage(instance_id, text))

    def attach(self, instance_id: str) -> None:
        self._know_server()
        self.request(c.Attach(instance_id))

    def _know_server(self) -> None:
        """Learn which server this is before holding anything there, so a restart is noticed."""
        if self.server_id is None:
            self.info()

    def terminate(self, instance_id: str) -> None:
        self.request(c.Terminate(instance_id))

    @contextmanager
    def ending_with_caller(self, instance_id: str) -> Iterator[None]:
        """Within it, a Ctrl-C (or a reader that closed its pipe, ``| head``) terminates ``instance_id``
        before it goes on up: an instance its caller stopped watching would otherwise run until the lease lapsed."""
        try:
            yield
        except (KeyboardInterrupt, BrokenPipeError):
            with contextlib.suppress(ControlRequestError):  # it may have ended meanwhile
                self.terminate(instance_id)
            raise

    def exports(self) -> list[c.ExportEntry]:
        return self.request(c.ListExports()).exports

    def remove_program(self, program: str) -> None:
        """Forget ``program`` (a name or SHA-256): this client's names for it and its upload."""
        self.request(c.RemoveProgram(program))

    def drop_export(self, name: str, owner: str = "") -> None:
        self.request(c.DropExport(name, owner))

    def info(self, timeout_s: float | None = None) -> c.ServerInfoReply:
        reply = self.request(c.ServerInfo(), timeout_s)
        self.lease_s = reply.lease_s
        self._check_server(reply.server_id)
        return reply

    def heartbeat(self) -> None:
        """Keep the lease; raises :class:`ServerRestarted` if the server is a new one, TimeoutError if none answers."""
        try:
            self._check_server(self.request(c.Heartbeat(), timeout_s=max(self.lease_s, 1.0)).server_id)
        except TimeoutError:
            raise TimeoutError(f"the oven server at {self.endpoint} stopped answering") from None

    def _check_server(self, server_id: str) -> None:
        if self.server_id is None:
            self.server_id = server_id
        elif server_id != self.server_id:
            raise ServerRestarted(f"the oven server at {self.endpoint} restarted: what this client launched "
                                  "there is gone")

    def add_client(self, name: str) -> str:
        """Operator only: admit client ``name``; its token."""
        return self.request(c.AddClient(name)).token

    def remove_client(self, name: str) -> None:
        self.request(c.RemoveClient(name))

    def clients(self) -> list[str]:
        return self.request(c.ListClients()).names

    def adapters(self) -> list[c.AdapterEntry]:
        return self.request(c.ListAdapters()).adapters

    def add_adapter(self, name: str, path: str, timeout_s: float = 300.0) -> c.AdapterEntry:
        """Operator only: ``path`` is a folder on the server's machine; answered once it is loaded."""
        return self.request(c.AddAdapter(name, path), timeout_s=timeout_s)

    def remove_adapter(self, name: str) -> None:
        self.request(c.RemoveAdapter(name))

    def stats(self) -> c.StatsReply:
        return self.request(c.Stats())

    def metrics(self) -> str:
        """The control process's Prometheus metrics, in the text exposition format (docs/openai.md lists them)."""
        return self.request(c.Metrics()).text

    def events(self, poll_s: float = 0.5) -> Iterator[c.InstanceEvent | None]:
        """Pushed events as they come; yields None when ``poll_s`` passes without one.

        Sends a heartbeat whenever the client has been quiet for a third of the lease.
        """
        while True:
            while self._events:
                yield self._events.pop(0)
            if time.monotonic() - self._last_sent > self.lease_s / 3:
                self.heartbeat()
                continue
            if self._sock.poll(int(min(poll_s, self.lease_s / 3) * 1000)):
                envelope = c.CODEC.decode(self._sock.recv())
                if isinstance(envelope.message, c.InstanceEvent):
                    yield envelope.message
            else:
                yield None

    def close(self) -> None:
        self._sock.disable_monitor()
        self._monitor.close(0)
        self._sock.close(0)

    def __enter__(self) -> "OvenClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
