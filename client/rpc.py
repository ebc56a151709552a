"""Python client of the control process: the verbs of the ``oven`` CLI as methods.

Every method is one round trip (uploads: one per chunk). :meth:`OvenClient.events`
yields the output of attached instances and keeps the client's lease alive.
"""

from __future__ import annotations

import hashlib
import itertools
import time
from pathlib import Path
from typing import Iterator

import zmq

from oven.proto import control as c


class ControlRequestError(RuntimeError):
    def __init__(self, error: c.ControlError):
        super().__init__(f"{error.code}: {error.message}")
        self.code = error.code


class OvenClient:
    def __init__(self, endpoint: str, timeout_s: float = 60.0):
        self.endpoint, self.timeout_s = endpoint, timeout_s
        self._sock = zmq.Context.instance().socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.connect(endpoint)
        self._ids = itertools.count(1)
        self._events: list[c.InstanceEvent] = []
        self._last_sent = time.monotonic()
        self.lease_s = c.DEFAULT_LEASE_S  # learnt from the server by info() / reachable()

    def request(self, message, timeout_s: float | None = None):
        """Send one request and wait for its reply; a ControlError raises :class:`ControlRequestError`."""
        request_id = next(self._ids)
        self._sock.send(c.CODEC.encode(message, request_id))
        self._last_sent = time.monotonic()
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._sock.poll(int(remaining * 1000)):
                raise TimeoutError(f"no reply from the oven server at {self.endpoint}")
            envelope = c.CODEC.decode(self._sock.recv())
            if isinstance(envelope.message, c.InstanceEvent):
                self._events.append(envelope.message)
            elif envelope.request_id == request_id:
                if isinstance(envelope.message, c.ControlError):
                    raise ControlRequestError(envelope.message)
                return envelope.message

    def reachable(self, timeout_s: float = 1.0) -> bool:
        try:
            self.info(timeout_s)
            return True
        except TimeoutError:
            return False

    def upload(self, wasm: bytes, name: str = "") -> str:
        digest = hashlib.sha256(wasm).hexdigest()
        for offset in range(0, len(wasm), c.UPLOAD_CHUNK_BYTES):
            chunk = wasm[offset:offset + c.UPLOAD_CHUNK_BYTES]
            reply = self.request(c.UploadChunk(name, digest, len(wasm), offset, chunk), timeout_s=300)
            if reply.complete:
                break
        return digest

    def upload_file(self, path: Path, name: str = "") -> str:
        return self.upload(Path(path).read_bytes(), name)

    def launch(self, program: str, args: list[str], detach: bool = False) -> str:
        return self.request(c.Launch(program, list(args), detach)).instance_id

    def programs(self) -> list[c.ProgramEntry]:
        return self.request(c.ListPrograms()).programs

    def instances(self) -> list[c.InstanceEntry]:
        return self.request(c.ListInstances()).instances

    def send(self, instance_id: str, text: str) -> None:
        self.request(c.SendMessage(instance_id, text))

    def attach(self, instance_id: str) -> None:
        self.request(c.Attach(instance_id))

    def terminate(self, instance_id: str) -> None:
        self.request(c.Terminate(instance_id))

    def exports(self) -> list[c.ExportEntry]:
        return self.request(c.ListExports()).exports

    def drop_export(self, name: str) -> None:
        self.request(c.DropExport(name))

    def info(self, timeout_s: float | None = None) -> c.ServerInfoReply:
        reply = self.request(c.ServerInfo(), timeout_s)
        self.lease_s = reply.lease_s
        return reply

    def stats(self) -> c.StatsReply:
        return self.request(c.Stats())

    def events(self, poll_s: float = 0.5) -> Iterator[c.InstanceEvent | None]:
        """Pushed events as they come; yields None when ``poll_s`` passes without one.

        Sends a heartbeat whenever the client has been quiet for a third of the lease.
        """
        while True:
            while self._events:
                yield self._events.pop(0)
            if time.monotonic() - self._last_sent > self.lease_s / 3:
                self.request(c.Heartbeat())
                continue
            if self._sock.poll(int(min(poll_s, self.lease_s / 3) * 1000)):
                envelope = c.CODEC.decode(self._sock.recv())
                if isinstance(envelope.message, c.InstanceEvent):
                    yield envelope.message
            else:
                yield None

    def close(self) -> None:
        self._sock.close(0)

    def __enter__(self) -> "OvenClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
