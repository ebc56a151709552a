"""Python client of the control process: the verbs of the ``oven`` CLI as methods (docs/client.md).

Every method is one round trip (uploads: one per chunk; :meth:`OvenClient.launch` of a local
program uploads it first). :meth:`OvenClient.run` launches a program and returns its
:class:`RunResult` at its exit; :meth:`OvenClient.instance_events` follows one instance to its
exit; :meth:`OvenClient.events` yields the events of every instance the client watches, for
ever. While any of them waits it keeps the client's lease alive.

The connection is a CurveZMQ session under the client's token (:func:`find_token`:
``--token``, ``OVEN_TOKEN``, or the operator's token that a server started by the
same user wrote). A server that refuses the token, or one that is not the server
the token names, raises :class:`AuthError` instead of leaving requests unanswered;
a server that restarted (a new ``server_id``) raises :class:`ServerRestarted`.
"""

from __future__ import annotations

import hashlib
import itertools
import time
import contextlib
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import zmq

from oven.proto import control as c
from oven.proto.auth import AuthError, Token, secure_client

from .discovery import default_endpoint, find_token, malformed_endpoint
from .programs import OnUpload, ProgramNotFound, launchable

__all__ = ["AuthError", "ControlRequestError", "InstanceTimeout", "OvenClient", "ProgramNotFound", "RunResult",
           "ServerRestarted", "default_endpoint", "find_token"]

POLL_S = 0.5  # longest wait for the socket between two looks at a deadline
OnEvent = Callable[[c.InstanceEvent], None]


class ControlRequestError(RuntimeError):
    """The server refused a request: ``code`` says why (``unknown_program``, ``forbidden``, ... as
    :class:`oven.proto.control.ControlError` lists them), the message says it for people."""

    def __init__(self, error: c.ControlError):
        super().__init__(f"{error.code}: {error.message}")
        self.code = error.code


class ServerRestarted(RuntimeError):
    """The server is not the one this client first spoke to: what the client launched there is gone."""


class InstanceTimeout(TimeoutError):
    """An instance did not exit within the time a caller gave it (a server that stops answering raises
    a plain TimeoutError)."""


@dataclass(frozen=True, slots=True)
class RunResult:
    """What one instance did, from its launch (or the client's attach) to its exit."""

    instance_id: str
    state: str  # finished | failed (its own fault) | killed (from outside), as `oven ps` shows it; "" if the
    # server no longer keeps its record (more than its finished_instances ended since)
    exit_code: int  # 0 when it finished; 143 when a client or a lapsed lease terminated it
    error: str  # why it failed or was killed; "" when it finished
    stdout: str  # all it printed, in order
    stderr: str
    messages: list[str]  # what it sent its client (send-to-client), in order

    @property
    def ok(self) -> bool:
        return self.state == "finished" and self.exit_code == 0 and not self.error


class OvenClient:
    """A connection to an ``oven serve``. ``endpoint`` defaults to :func:`default_endpoint`, ``token`` (a
    :class:`Token`, its text, or @FILE) to :func:`find_token`'s; ``timeout_s`` bounds each request. A
    bad endpoint raises ValueError here; a missing token raises :class:`AuthError` at the first request."""

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
        self._events: list[c.InstanceEvent] = []  # pushed, not yet taken by events() or instance_events()
        self._watching: set[str] = set()  # instances whose events come here: launched or attached, not exited
        self._last_sent = time.monotonic()
        self.lease_s = c.DEFAULT_LEASE_S  # learnt from the server by info() / reachable()
        self.server_id: str | None = None  # learnt from the first info() or heartbeat

    def request(self, message, timeout_s: float | None = None):
        """Send one protocol message (:mod:`oven.proto.control`) and wait for its reply; a ControlError raises
        :class:`ControlRequestError`, no reply within ``timeout_s`` (default: the client's) TimeoutError."""
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
        from zmq.utils.monitor import recv_monitor_message  # brings asyncio: only on this rare path

        while self._monitor.poll(0):
            event = recv_monitor_message(self._monitor)["event"]
            if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                raise AuthError(f"the server at {self.endpoint} refused this client's token")
            # A server that cannot read our hello (it has another key) just hangs up.
            raise AuthError(f"the server at {self.endpoint} is not the server this token was made for")

    def reachable(self, timeout_s: float = 1.0) -> bool:
        """Whether the server answers within ``timeout_s`` and admits this client's token."""
        try:
            self.info(timeout_s)
            return True
        except (TimeoutError, AuthError):
            return False

    def upload(self, wasm: bytes, name: str = "", shared: bool = False, busy_wait_s: float = 60.0) -> str:
        """Store ``wasm`` (named ``name`` among this client's programs, or the library's if ``shared``).
        A chunk refused ``upload_busy`` (the server's upload buffers or compile slots are full; it keeps
        what it took) is sent again after a pause, for up to ``busy_wait_s`` in all. Returns its SHA-256;
        raises ControlRequestError (``bad_program``: not a component the server can compile,
        ``program_quota``, ``forbidden`` for ``shared`` from a client other than the operator)."""
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
        """:meth:`upload` of the file at ``path`` (OSError if it cannot be read)."""
        return self.upload(Path(path).read_bytes(), name, shared)

    def launch(self, program: str, args: Sequence[str] = (), detach: bool = False,
               on_upload: OnUpload | None = None) -> str:
        """Start an instance of ``program`` with ``args``; its instance id. ``program`` means what it means to
        ``oven run``: a ``.wasm`` file, an inferlet folder or a library inferlet's name is uploaded (under its
        name; ``on_upload(name, size_bytes)`` is told first when the server lacks it) and launched; else a
        name this client uploaded, a shared one, or a SHA-256. This client watches the instance; unless
        ``detach`` the instance ends when the client's lease lapses. Raises :class:`ProgramNotFound` (a file
        or inferlet here that is missing or not built) or ControlRequestError (``unknown_program``,
        ``launch_failed``, ``too_many_instances``, ...)."""
        self._know_server()
        ref = launchable(self, program, on_upload)
        # a program whose code the server must compile again (a new wasmtime) is answered after seconds
        instance_id = self.request(c.Launch(ref, list(args), detach), timeout_s=300).instance_id
        self._watching.add(instance_id)
        return instance_id

    def run(self, program: str, args: Sequence[str] = (), *, on_event: OnEvent | None = None,
            timeout_s: float | None = None, on_upload: OnUpload | None = None) -> RunResult:
        """:meth:`launch` ``program``, follow it to its exit (:meth:`wait`) and return what it did. A Ctrl-C, or
        ``timeout_s`` passing (:class:`InstanceTimeout`), terminates it on the way out. Raises what
        :meth:`launch` raises."""
        instance_id = self.launch(program, args, on_upload=on_upload)
        with self.ending_with_caller(instance_id):
            try:
                return self.wait(instance_id, on_event, timeout_s)
            except InstanceTimeout:
                with contextlib.suppress(ControlRequestError):  # it may have ended meanwhile
                    self.terminate(instance_id)
                raise

    def wait(self, instance_id: str, on_event: OnEvent | None = None,
             timeout_s: float | None = None) -> RunResult:
        """Collect ``instance_id``'s events (:meth:`instance_events`) until its exit; ``on_event`` sees each
        one first (it may :meth:`send` or :meth:`terminate`). Raises what :meth:`instance_events` raises."""
        outputs: dict[str, list[str]] = {"stdout": [], "stderr": [], "message": []}
        exit_event = None
        for event in self.instance_events(instance_id, timeout_s):
            if on_event is not None:
                on_event(event)
            if event.kind == "exit":
                exit_event = event
            elif event.kind in outputs:
                outputs[event.kind].append(event.text)
        # The exit event says how it ended, not whether from outside: the server's record does.
        state = next((i.state for i in self.instances() if i.instance_id == instance_id), "")
        return RunResult(instance_id, state, exit_event.exit_code, exit_event.text, "".join(outputs["stdout"]),
                         "".join(outputs["stderr"]), outputs["message"])

    def programs(self) -> list[c.ProgramEntry]:
        """The programs this client may launch (the operator: all), with its names and the shared library's
        (``library:NAME``)."""
        return self.request(c.ListPrograms()).programs

    def instances(self) -> list[c.InstanceEntry]:
        """This client's instances (the operator: everyone's), running and recently ended."""
        return self.request(c.ListInstances()).instances

    def send(self, instance_id: str, text: str) -> None:
        """Put ``text`` in the instance's inbox (its ``receive``). Raises ControlRequestError:
        ``unknown_instance`` (not running), ``forbidden`` (another client's), ``inbox_full``."""
        self.request(c.SendMessage(instance_id, text))

    def attach(self, instance_id: str) -> None:
        """Watch an instance: its events so far (its exit too, if it ended recently) come to this client, then
        the rest. Raises ControlRequestError ``unknown_instance`` or ``forbidden``."""
        self._know_server()
        self.request(c.Attach(instance_id))
        self._watching.add(instance_id)

    def _know_server(self) -> None:
        """Learn which server this is before holding anything there, so a restart is noticed."""
        if self.server_id is None:
            self.info()

    def terminate(self, instance_id: str) -> None:
        """Kill a running instance (it exits with 143, state ``killed``). Raises ControlRequestError
        ``unknown_instance`` (it is not running) or ``forbidden``."""
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
        """The named KvPage exports this client's inferlets made (the operator: everyone's), oldest first."""
        return self.request(c.ListExports()).exports

    def remove_program(self, program: str) -> None:
        """Forget ``program`` (a name or SHA-256): this client's names for it and its upload."""
        self.request(c.RemoveProgram(program))

    def drop_export(self, name: str, owner: str = "") -> None:
        """Release export ``name`` (``owner``'s: operator only). Raises ControlRequestError ``unknown_export``."""
        self.request(c.DropExport(name, owner))

    def info(self, timeout_s: float | None = None) -> c.ServerInfoReply:
        """What the server serves (model, page size, lease, the name it knows this client by). Raises
        :class:`ServerRestarted` if it is not the server this client first spoke to."""
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
        """Operator only: refuse client ``name`` from now on (its instances are terminated)."""
        self.request(c.RemoveClient(name))

    def clients(self) -> list[str]:
        """Operator only: the names of the admitted clients."""
        return self.request(c.ListClients()).names

    def adapters(self) -> list[c.AdapterEntry]:
        """The LoRA adapters the server offers (inferlets open them by name)."""
        return self.request(c.ListAdapters()).adapters

    def add_adapter(self, name: str, path: str, timeout_s: float = 300.0) -> c.AdapterEntry:
        """Operator only: ``path`` is a folder on the server's machine; answered once it is loaded."""
        return self.request(c.AddAdapter(name, path), timeout_s=timeout_s)

    def remove_adapter(self, name: str) -> None:
        """Operator only: unload adapter ``name`` and delete it from the server's store."""
        self.request(c.RemoveAdapter(name))

    def stats(self) -> c.StatsReply:
        """The scheduler's counters since the server started (batches, free pages, interceptions, ...)."""
        return self.request(c.Stats())

    def metrics(self) -> str:
        """The control process's Prometheus metrics, in the text exposition format (docs/openai.md lists them)."""
        return self.request(c.Metrics()).text

    def events(self, poll_s: float = POLL_S) -> Iterator[c.InstanceEvent | None]:
        """The events of every instance this client watches, as they come; None whenever ``poll_s`` passes
        without one, so a caller can act between events. It never ends by itself: leave the loop when
        done (:meth:`instance_events` ends at an instance's exit). Keeps the lease; raises as :meth:`heartbeat`."""
        while True:
            if self._events:
                yield self._taken(0)
            elif not self._receive(poll_s):
                yield None

    def instance_events(self, instance_id: str, timeout_s: float | None = None) -> Iterator[c.InstanceEvent]:
        """One instance's events, ending with its exit event; the client attaches first if it did not
        launch or attach it (then from its start). Other instances' events wait for their own reader.
        Keeps the lease. Raises :class:`InstanceTimeout` if ``timeout_s`` passes first (the instance goes on),
        ControlRequestError from the attach, and as :meth:`heartbeat`."""
        if instance_id not in self._watching:
            self.attach(instance_id)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            index = next((i for i, e in enumerate(self._events) if e.instance_id == instance_id), None)
            if index is not None:
                event = self._taken(index)
                yield event
                if event.kind == "exit":
                    return
                continue
            remaining = POLL_S if deadline is None else deadline - time.monotonic()
            if remaining <= 0:
                raise InstanceTimeout(f"instance {instance_id} did not exit within {timeout_s:g} s")
            self._receive(min(remaining, POLL_S))

    def _taken(self, index: int) -> c.InstanceEvent:
        """Take the kept event at ``index``; an exit ends the watch."""
        event = self._events.pop(index)
        if event.kind == "exit":
            self._watching.discard(event.instance_id)
        return event

    def _receive(self, wait_s: float) -> bool:
        """Keep the next pushed event, waiting up to ``wait_s``; False if none came. When the client has been
        quiet for a third of the lease it sends a heartbeat instead (events that come meanwhile are kept)."""
        if time.monotonic() - self._last_sent > self.lease_s / 3:
            self.heartbeat()
            return True
        if not self._sock.poll(int(min(wait_s, self.lease_s / 3) * 1000)):
            return False
        envelope = c.CODEC.decode(self._sock.recv())
        if isinstance(envelope.message, c.InstanceEvent):
            self._events.append(envelope.message)
        return True  # (or a late reply to a request that timed out: dropped)

    def close(self) -> None:
        """Close the connection (the server terminates this client's non-detached instances when the lease lapses)."""
        self._sock.disable_monitor()
        self._monitor.close(0)
        self._sock.close(0)

    def __enter__(self) -> "OvenClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
