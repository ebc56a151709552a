"""The control process's client-facing RPC: a ZeroMQ ROUTER served from the control loop's thread.

Requests are dispatched through a type -> handler table; a malformed message
or a failing handler gets a :class:`ControlError` reply and the server goes
on. Instance output is pushed as :class:`InstanceEvent` to attached clients.
Clients hold a lease by talking at least every ``lease_s`` seconds; when it
lapses, their non-detached instances are terminated (see proto/control.py).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import defaultdict

import zmq

from oven.proto import control as c
from oven.proto.codec import ProtocolError

from .outbox import ClientOutbox
from .resources import ResourceError
from .runtime.instance import Instance, InstanceRecord
from .runtime.loop import ControlLoop
from .runtime.programs import ProgramError

log = logging.getLogger(__name__)

MAX_UPLOAD_BYTES = 256 << 20
MAX_BUFFERED_UPLOAD_BYTES = 1 << 30  # partial uploads of all clients together
# Frames waiting for one client (ClientOutbox) beyond its ZeroMQ pipe: past HOLD_FRAMES the instances
# it watches run no further slice until it catches up; past a DROP limit it is taken for gone (a
# client that sends but never reads), as if its lease had expired.
HOLD_FRAMES = 1000
DROP_FRAMES, DROP_BYTES = 1_000_000, 256 << 20


class RequestFailed(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.reply = c.ControlError(code, message)


class ControlServer:
    def __init__(self, loop: ControlLoop, endpoint: str):
        self.loop, self.endpoint = loop, endpoint
        self.sock = zmq.Context.instance().socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.MAXMSGSIZE, c.UPLOAD_CHUNK_BYTES + (1 << 20))
        self.sock.bind(endpoint)
        self.outbox = ClientOutbox(self.sock)
        self._held: set[str] = set()  # instances whose output a watcher is behind on
        self._uploads: dict[tuple[bytes, str], bytearray] = {}
        self._watchers: dict[str, set[bytes]] = defaultdict(set)  # instance id -> client identities
        self._owned: dict[bytes, set[str]] = defaultdict(set)  # client -> instances it must keep alive
        self._last_heard: dict[bytes, float] = {}
        self._handlers = {
            c.UploadChunk: self._upload, c.ListPrograms: self._list_programs, c.Launch: self._launch,
            c.ListInstances: self._list_instances, c.SendMessage: self._send, c.Attach: self._attach,
            c.Terminate: self._terminate, c.ListExports: self._list_exports, c.DropExport: self._drop_export,
            c.ServerInfo: self._server_info, c.Stats: self._stats,
            c.Heartbeat: lambda _client, _req: c.Ok(),
        }

    def on_event(self, inst: Instance, kind: str, payload) -> None:
        """The loop's event sink: forward instance output to attached clients."""
        if kind == "exit":
            event = c.InstanceEvent(inst.instance_id, "exit", inst.error or "", payload)
        else:
            event = c.InstanceEvent(inst.instance_id, kind, str(payload))
        frame = c.CODEC.encode(event)
        for client in self._watchers.get(inst.instance_id, ()):
            self.outbox.send(client, frame)
        if kind == "exit":
            for client in self._watchers.pop(inst.instance_id, ()):
                self._owned[client].discard(inst.instance_id)

    def serve_forever(self, should_stop) -> None:
        while not should_stop():
            # With frames waiting for a slow client, look again soon: it may have read some.
            self.loop.step(0.005 if self.outbox.backlogs else 0.05, {self.sock: self._drain})
            self._flush()
            self._expire_leases(time.monotonic())

    def _flush(self) -> None:
        """Send what waits for slow clients; hold the instances they are behind on, drop clients that never read."""
        self.outbox.flush()
        backlogs = self.outbox.backlogs
        for client, backlog in list(backlogs.items()):
            if len(backlog.frames) > DROP_FRAMES or backlog.num_bytes > DROP_BYTES:
                self._drop_client(client, f"its client stopped reading ({len(backlog.frames)} frames, "
                                          f"{backlog.num_bytes >> 20} MiB unread)")
        behind = {client for client, backlog in backlogs.items() if len(backlog.frames) > HOLD_FRAMES}
        held = {instance_id for instance_id, clients in self._watchers.items() if clients & behind} if behind else set()
        if held or self._held:
            for instance_id in held ^ self._held:
                if (inst := self.loop.instances.get(instance_id)) is not None:
                    inst.output_held = instance_id in held
            self._held = held

    def _drain(self) -> None:
        while self.sock.poll(0):
            frames = self.sock.recv_multipart()
            if len(frames) < 2:
                continue
            client, payload = frames[0], frames[-1]
            self._last_heard[client] = time.monotonic()
            self.outbox.send(client, self._handle(client, payload))

    def _handle(self, client: bytes, payload: bytes) -> bytes:
        try:
            envelope = c.CODEC.decode(payload)
        except ProtocolError as exc:
            return c.CODEC.encode(c.ControlError("malformed", str(exc)), c.CODEC.peek_request_id(payload))
        handler = self._handlers.get(type(envelope.message))
        try:
            if handler is None:
                raise RequestFailed("not_a_request", f"{type(envelope.message).__name__} is not a request")
            reply = handler(client, envelope.message)
        except RequestFailed as exc:
            reply = exc.reply
        except Exception as exc:  # a bug in a handler must not take the server down
            log.exception("request %s failed", type(envelope.message).__name__)
            reply = c.ControlError("internal", f"{type(exc).__name__}: {exc}")
        return c.CODEC.encode(reply, envelope.request_id)

    # -- handlers ------------------------------------------------------------

    def _upload(self, client: bytes, req: c.UploadChunk) -> c.UploadReply:
        if not 0 < req.total_bytes <= MAX_UPLOAD_BYTES:
            raise RequestFailed("bad_upload", f"a program must be 1 byte to {MAX_UPLOAD_BYTES >> 20} MiB")
        if self.loop.programs.has(req.sha256):  # already stored and compiled: only the name may be new
            if req.name:
                self.loop.programs.set_name(req.name, req.sha256)
            return c.UploadReply(req.sha256, req.total_bytes, True)
        key = (client, req.sha256)
        if sum(map(len, self._uploads.values())) + len(req.data) > MAX_BUFFERED_UPLOAD_BYTES:
            raise RequestFailed("upload_busy", f"{MAX_BUFFERED_UPLOAD_BYTES >> 20} MiB of unfinished uploads are "
                                               "buffered already: try again when they finish")
        buffer = self._uploads.setdefault(key, bytearray())
        if req.offset != len(buffer) or req.offset + len(req.data) > req.total_bytes:
            self._uploads.pop(key, None)
            raise RequestFailed("bad_upload", f"chunk at offset {req.offset} does not follow {len(buffer)} bytes")
        buffer += req.data
        if len(buffer) < req.total_bytes:
            return c.UploadReply(req.sha256, len(buffer), False)
        data = bytes(self._uploads.pop(key))
        if hashlib.sha256(data).hexdigest() != req.sha256:
            raise RequestFailed("bad_upload", "the uploaded bytes do not match their SHA-256")
        try:
            self.loop.programs.add(data, req.name or None)
        except ProgramError as exc:
            raise RequestFailed("bad_program", str(exc)) from None
        return c.UploadReply(req.sha256, len(data), True)

    def _list_programs(self, _client, _req) -> c.ProgramList:
        return c.ProgramList([c.ProgramEntry(h, names, size) for h, names, size in self.loop.programs.entries()])

    def _launch(self, client: bytes, req: c.Launch) -> c.Launched:
        try:
            inst = self.loop.launch(req.program, req.args)
        except ProgramError as exc:
            raise RequestFailed("unknown_program", str(exc)) from None
        except Exception as exc:  # instantiation traps, limits
            raise RequestFailed("launch_failed", f"{type(exc).__name__}: {exc}") from None
        self._watchers[inst.instance_id].add(client)
        if not req.detach:
            self._owned[client].add(inst.instance_id)
        return c.Launched(inst.instance_id)

    def _list_instances(self, _client, _req) -> c.InstanceList:
        now = time.monotonic()

        def entry(i: Instance | InstanceRecord, state: str) -> c.InstanceEntry:
            return c.InstanceEntry(i.instance_id, i.program[:12], state, now - i.started_at, i.exit_code, i.error or "")
        running = [entry(i, "held" if i.output_held and i.alive else i.state.value)
                   for i in self.loop.instances.values()]
        return c.InstanceList(running + [entry(r, r.state.value) for r in self.loop.finished.values()])

    def _instance(self, instance_id: str) -> Instance:
        inst = self.loop.instances.get(instance_id)
        if inst is None:
            raise RequestFailed("unknown_instance", f"no running instance {instance_id!r}")
        return inst

    def _send(self, _client, req: c.SendMessage) -> c.Ok:
        self._instance(req.instance_id).inbox.push(req.text)
        return c.Ok()

    def _attach(self, client: bytes, req: c.Attach) -> c.Ok:
        self._instance(req.instance_id)
        self._watchers[req.instance_id].add(client)
        return c.Ok()

    def _terminate(self, _client, req: c.Terminate) -> c.Ok:
        self.loop.kill(self._instance(req.instance_id), "terminated by a client", exit_code=143)
        return c.Ok()

    def _list_exports(self, _client, _req) -> c.ExportList:
        running = self.loop.instances
        return c.ExportList([c.ExportEntry(e.name, len(e.page_ids), e.owner_id, e.owner_id in running)
                             for e in self.loop.exports.exports()])

    def _drop_export(self, _client, req: c.DropExport) -> c.Ok:
        try:
            self.loop.drop_export(req.name)
        except ResourceError as exc:  # "no kvpage export named ..."
            raise RequestFailed("unknown_export", str(exc)) from None
        return c.Ok()

    def _server_info(self, _client, _req) -> c.ServerInfoReply:
        info = self.loop.info
        return c.ServerInfoReply([info.model_name], list(info.traits), info.page_size, info.num_kv_pages,
                                 info.num_embeds, info.device, self.loop.config.dispatch_policy,
                                 len(self.loop.instances), self.loop.config.lease_s)

    def _stats(self, _client, _req) -> c.StatsReply:
        s = self.loop.scheduler.stats()
        return c.StatsReply(s.num_batches, s.num_commands, s.num_horizontal_batches, s.num_vertical_batches,
                            s.mean_batch_size, self.loop.kv_pool.num_free, self.loop.embed_pool.num_free,
                            self.loop.host_pool.num_free)

    # -- leases ----------------------------------------------------------------

    def _expire_leases(self, now: float) -> None:
        for client, heard in list(self._last_heard.items()):
            if now - heard > self.loop.config.lease_s:
                self._drop_client(client, "its client went away (lease expired)")

    def _drop_client(self, client: bytes, reason: str) -> None:
        """Forget ``client``: terminate the instances it launched attached, drop its unfinished uploads,
        stop sending it anything."""
        owned = self._owned.pop(client, set())
        if owned or client in self.outbox.backlogs:  # a one-shot client (oven ps) leaves silently
            log.warning("dropping client %s: %s", client.hex(), reason)
        self._last_heard.pop(client, None)
        for key in [key for key in self._uploads if key[0] == client]:  # unfinished: nobody will finish them
            del self._uploads[key]
        for watchers in self._watchers.values():
            watchers.discard(client)
        self.outbox.forget(client)  # after the line above, no exit event below is queued for it again
        for instance_id in owned:
            inst = self.loop.instances.get(instance_id)
            if inst is not None:
                self.loop.kill(inst, reason, exit_code=143)
