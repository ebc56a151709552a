"""The control process's client-facing RPC: a ZeroMQ ROUTER served from the control loop's thread.

Every peer is a CurveZMQ client the server's :class:`Keyring` admits, and every
message arrives with its client's name (ZAP's ``User-Id``): what a client launches,
exports or names is its own, and a request on another client's instance or export is
``forbidden`` unless it comes from the operator.

Requests are dispatched through a type -> handler table; a malformed message
or a failing handler gets a :class:`ControlError` reply and the server goes
on. Instance output is pushed as :class:`InstanceEvent` to attached clients.
Clients hold a lease by talking at least every ``lease_s`` seconds; when it
lapses, their non-detached instances are terminated (see proto/control.py).
"""

from __future__ import annotations

import ctypes
import logging
import secrets
import time
from collections import Counter, defaultdict
from collections.abc import Callable

import zmq

from oven.proto import control as c
from oven.proto.auth import OPERATOR, Admission, AuthError, secure_server, user_id
from oven.proto.codec import ProtocolError
from oven.proto.endpoints import bind

from .adapter_requests import AdapterRequests
from .keyring import Keyring
from .outbox import ClientOutbox
from .output_log import OutputLog
from .program_requests import ProgramRequests
from .requests import LATER, Caller, RequestFailed
from .resources.slab import ResourceError
from .runtime.instance import Instance
from .runtime.loop import ControlLoop
from .runtime.programs import ProgramError

log = logging.getLogger(__name__)

# What waits for one client connection: frames in its ZeroMQ pipe, which holds PIPE_FRAMES, and behind
# them in ClientOutbox. Counted in bytes (ClientOutbox.unread_bytes), the pipe's included, and in frames:
# past a HOLD limit the instances it watches run no further slice until it catches up; past a DROP limit
# it is taken for gone (a client that sends but never reads), as if its lease had expired.
PIPE_FRAMES = 64
HOLD_FRAMES, HOLD_BYTES = 1000, 4 << 20
DROP_FRAMES, DROP_BYTES = 1_000_000, 256 << 20
# Connections dropped while they held something, remembered (oldest forgotten first) so that the next
# heartbeat of one that comes back is told what it lost, instead of it waiting for events that never come.
MAX_DROPPED_ROUTES = 4096
# Requests served per turn: past it the loop steps (inferlets run, batches go out, slow and silent
# clients are dealt with) before the rest are read, so a client that floods requests cannot stall
# every other client's instances. ROUTER fair-queues its connections, so each turn's share is fair too.
MAX_REQUESTS_PER_TURN = 256


class ControlServer(AdapterRequests, ProgramRequests):
    """Binds at once, so an endpoint in use fails before a model loads; serves once ``loop`` is set.

    ``clock`` (monotonic seconds) times the clients' leases.
    """

    def __init__(self, endpoint: str, keyring: Keyring, loop: ControlLoop | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.loop, self.endpoint, self.keyring, self._clock = loop, endpoint, keyring, clock
        self.server_id = secrets.token_hex(8)
        ctx = zmq.Context.instance()
        # The ROUTER draws the first id it gives an id-less peer from libc's rand(), which nothing seeds; seeded,
        # the ids it gives cannot be foreseen should a peer's own id get past ZAP's (see proto/auth.py).
        ctypes.CDLL(None).srand(secrets.randbits(32))
        self.sock = ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.MAXMSGSIZE, c.UPLOAD_CHUNK_BYTES + (1 << 20))
        self._admission = Admission(ctx, keyring.admitted())
        # Routing ids are ZAP's, not a peer's own: one that a peer chose could crash this ROUTER (proto/auth.py).
        secure_server(self.sock, keyring.server, self._admission)
        self.outbox = ClientOutbox(self.sock, PIPE_FRAMES)  # before the bind: its pipes take the outbox's HWM
        bind(self.sock, endpoint)
        self.output = OutputLog()  # what attaching clients are shown first
        self._held: set[str] = set()  # instances whose output a watcher is behind on
        self._watchers: dict[str, set[bytes]] = defaultdict(set)  # instance id -> client routes
        self._owned: dict[bytes, set[str]] = defaultdict(set)  # client route -> instances it must keep alive
        self._last_heard: dict[bytes, float] = {}
        self._awaiting: Counter[bytes] = Counter()  # route -> its requests answered LATER, not yet answered
        # route -> (why it was dropped, instances killed, instances watched); MAX_DROPPED_ROUTES, oldest first
        self._dropped: dict[bytes, tuple[str, int, set[str]]] = {}
        self._handlers = {
            c.UploadChunk: self._upload, c.ListPrograms: self._list_programs, c.RemoveProgram: self._remove_program,
            c.Launch: self._launch,
            c.ListInstances: self._list_instances, c.SendMessage: self._send, c.Attach: self._attach,
            c.Terminate: self._terminate, c.ListExports: self._list_exports, c.DropExport: self._drop_export,
            c.ServerInfo: self._server_info, c.Stats: self._stats, c.Metrics: self._metrics,
            c.Heartbeat: self._heartbeat,
            c.AddClient: self._add_client, c.RemoveClient: self._remove_client, c.ListClients: self._list_clients,
            c.ListAdapters: self._list_adapters, c.AddAdapter: self._add_adapter,
            c.RemoveAdapter: self._remove_adapter,
        }
        self._replying_to: tuple[bytes, int] = (b"", 0)  # the request being handled: (route, request id)
        self._init_programs()

    def on_event(self, inst: Instance, kind: str, payload) -> None:
        """The loop's event sink: forward instance output to attached clients."""
        if kind == "exit":
            event = c.InstanceEvent(inst.instance_id, "exit", inst.error or "", payload)
        else:
            event = c.InstanceEvent(inst.instance_id, kind, str(payload))
        frame = c.CODEC.encode(event)
        self.output.record(inst.instance_id, frame)
        for route in self._watchers.get(inst.instance_id, ()):
            self.outbox.send(route, frame)
        if kind == "exit":
            for route in self._watchers.pop(inst.instance_id, ()):
                self._owned[route].discard(inst.instance_id)
            self._prune_output()

    def _prune_output(self) -> None:
        """Keep the output only of instances the loop still knows (running, or among the recently ended)."""
        self.output.keep_only(lambda i: self.loop.record(i) is not None or self.loop.ended(i) is not None)

    def serve_forever(self, should_stop: Callable[[], bool]) -> None:
        while not should_stop():
            self.turn()

    def turn(self) -> None:
        """One turn of the loop, serving the requests that arrive meanwhile; then send what waits for
        slow clients and drop those whose lease has lapsed."""
        # With frames waiting for a slow client, look again soon: it may have read some.
        self.loop.step(0.005 if self.outbox.backlogs else 0.05, {self.sock: self._drain})
        self._flush()
        self._expire_leases(self._clock())

    def close(self) -> None:
        self._close_programs()
        self._admission.close()
        self.sock.close(0)

    def _flush(self) -> None:
        """Send what waits for slow clients; hold the instances they are behind on, drop clients that never read."""
        self.outbox.flush()
        backlogs = self.outbox.backlogs
        unread = {route: self.outbox.unread_bytes(route) for route in backlogs}
        for route, backlog in list(backlogs.items()):
            if len(backlog.frames) > DROP_FRAMES or unread[route] > DROP_BYTES:
                what = f"{len(backlog.frames)} frames waiting, {unread[route] >> 20} MiB unread"
                self._drop_client(route, f"its client stopped reading ({what})", f"it stopped reading: {what}")
        behind = {route for route, backlog in backlogs.items()
                  if len(backlog.frames) > HOLD_FRAMES or unread[route] > HOLD_BYTES}
        held = {instance_id for instance_id, routes in self._watchers.items() if routes & behind} if behind else set()
        if held or self._held:
            for instance_id in held ^ self._held:
                self.loop.hold_output(instance_id, instance_id in held)
            self._held = held

    def _drain(self) -> None:
        for _ in range(MAX_REQUESTS_PER_TURN):
            if not self.sock.poll(0):
                break
            frames = self.sock.recv_multipart(copy=False)
            if len(frames) < 2:
                continue
            caller = Caller(frames[0].bytes, user_id(frames[-1]) or OPERATOR)  # None: an in-process peer
            self._last_heard[caller.route] = self._clock()
            reply = self._handle(caller, frames[-1].bytes)
            if reply is not None:
                self.outbox.send(caller.route, reply)

    def _handle(self, caller: Caller, payload: bytes) -> bytes | None:
        """The encoded reply, or None when the handler answers later (see LATER)."""
        try:
            envelope = c.CODEC.decode(payload)
        except ProtocolError as exc:
            return c.CODEC.encode(c.ControlError("malformed", str(exc)), c.CODEC.peek_request_id(payload))
        handler, kind = self._handlers.get(type(envelope.message)), type(envelope.message).__name__
        self._replying_to = (caller.route, envelope.request_id)
        if caller.name not in self.keyring:  # a connection keeps its handshake's name: its client may be gone
            reply = c.ControlError("forbidden", f"client {caller.name!r} was removed: its token no longer works")
        elif handler is None:
            reply = c.ControlError("not_a_request", f"{kind} is not a request")
        else:
            reply = self._answered(kind, lambda: handler(caller, envelope.message))
        return None if reply is LATER else c.CODEC.encode(reply, envelope.request_id)

    def _answered(self, kind: str, make: Callable[[], object]) -> object:
        """``make()``, a request's reply (or LATER); a RequestFailed is its error reply, and any other
        exception an ``internal`` one, logged: a bug in a handler must not take the server down."""
        try:
            return make()
        except RequestFailed as exc:
            return exc.reply
        except Exception as exc:
            log.exception("request %s failed", kind)
            return c.ControlError("internal", f"{type(exc).__name__}: {exc}")

    def _reply_later(self) -> Callable[[object], None]:
        """For a handler that returns LATER: what sends its reply when it has one. Meanwhile the client
        holds its lease: it waits for the server, which is not silence (a compile takes longer than a lease)."""
        route, request_id = self._replying_to
        self._awaiting[route] += 1

        def reply(message) -> None:
            self._awaiting[route] -= 1
            if not self._awaiting[route]:
                del self._awaiting[route]
            if route in self._last_heard:
                self._last_heard[route] = self._clock()
            self.outbox.send(route, c.CODEC.encode(message, request_id))
        return reply

    # -- instances -----------------------------------------------------------------------------

    def _launch(self, caller: Caller, req: c.Launch):
        """Launch at once if the program's code is in memory, else once it is loaded (``LATER``)."""
        try:
            digest = self.loop.programs.resolve(req.program, caller.name)
        except ProgramError as exc:
            raise RequestFailed("unknown_program", str(exc)) from None
        if self.loop.programs.loaded(digest) is None:
            return self._load_later(digest, lambda: self._launch_now(caller, req, digest))
        return self._launch_now(caller, req, digest)

    def _launch_now(self, caller: Caller, req: c.Launch, digest: str) -> c.Launched:
        if not caller.operator:
            running = self.loop.num_instances(caller.name)
            if running >= self.loop.config.max_instances_per_client:
                raise RequestFailed("too_many_instances", f"this client runs {running} instances, its maximum "
                                                          "(oven serve --max-instances-per-client)")
        try:
            inst = self.loop.launch(digest, req.args, owner=caller.name)
            inst.launched_as = self.loop.programs.launch_name(req.program, digest, caller.name)
        except ProgramError as exc:
            raise RequestFailed("unknown_program", str(exc)) from None
        except Exception as exc:  # instantiation traps, limits
            raise RequestFailed("launch_failed", f"{type(exc).__name__}: {exc}") from None
        self._watchers[inst.instance_id].add(caller.route)
        if not req.detach:
            self._owned[caller.route].add(inst.instance_id)
        return c.Launched(inst.instance_id)

    def _list_instances(self, caller: Caller, _req) -> c.InstanceList:
        now, snapshot = time.monotonic(), self.loop.snapshot()
        return c.InstanceList([c.InstanceEntry(r.instance_id, self.loop.programs.shown_name(r.program, r.launched_as,
                                                                                            r.owner),
                                               r.shown_state, now - r.started_at,
                                               r.exit_code, r.error or "", r.owner, r.cpu_s, r.replica, r.parent)
                               for r in snapshot.instances + snapshot.finished
                               if caller.operator or r.owner == caller.name])

    def _check_running(self, caller: Caller, instance_id: str) -> None:
        """Raise unless ``instance_id`` runs and is the caller's (or the caller is the operator)."""
        record = self.loop.record(instance_id)
        if record is None:
            raise RequestFailed("unknown_instance", f"no running instance {instance_id!r}")
        if record.owner != caller.name and not caller.operator:
            raise RequestFailed("forbidden", f"instance {instance_id} belongs to another client")

    def _send(self, caller: Caller, req: c.SendMessage) -> c.Ok:
        self._check_running(caller, req.instance_id)
        try:
            self.loop.deliver(req.instance_id, req.text)
        except OverflowError as exc:
            raise RequestFailed("inbox_full", str(exc)) from None
        return c.Ok()

    def _attach(self, caller: Caller, req: c.Attach) -> c.Ok:
        """Send what the instance wrote so far (its exit too, if it ended), then what it writes from now on."""
        ended = self.loop.ended(req.instance_id)
        if ended is None:
            self._check_running(caller, req.instance_id)
        elif ended.owner != caller.name and not caller.operator:
            raise RequestFailed("forbidden", f"instance {req.instance_id} belongs to another client")
        for frame in self.output.replay(req.instance_id):
            self.outbox.send(caller.route, frame)
        if ended is None:
            self._watchers[req.instance_id].add(caller.route)
        return c.Ok()

    def _terminate(self, caller: Caller, req: c.Terminate) -> c.Ok:
        self._check_running(caller, req.instance_id)
        self.loop.terminate(req.instance_id, "terminated by a client", exit_code=143)
        return c.Ok()

    # -- exports -------------------------------------------------------------------------------

    def _list_exports(self, caller: Caller, _req) -> c.ExportList:
        snapshot = self.loop.snapshot()
        running = {r.instance_id for r in snapshot.instances}
        # A named snapshot is its client's, not an instance's: no exporter (resources/exports.py).
        return c.ExportList([c.ExportEntry(e.name, len(e.page_ids), e.owner_id or "", e.owner_id in running,
                                           e.namespace)
                             for e in snapshot.exports if caller.operator or e.namespace == caller.name])

    def _drop_export(self, caller: Caller, req: c.DropExport) -> c.Ok:
        owner = req.owner or caller.name
        if owner != caller.name and not caller.operator:
            raise RequestFailed("forbidden", f"export {req.name!r} of {owner!r} belongs to another client")
        try:
            self.loop.drop_export(req.name, namespace=owner)
        except ResourceError as exc:  # "no kvpage export named ..."
            raise RequestFailed("unknown_export", str(exc)) from None
        return c.Ok()

    # -- the server ----------------------------------------------------------------------------

    def _server_info(self, caller: Caller, _req) -> c.ServerInfoReply:
        info = self.loop.info
        return c.ServerInfoReply([info.model_name], list(info.traits), info.page_size, info.num_kv_pages,
                                 info.num_embeds, info.device, self.loop.config.dispatch_policy,
                                 self.loop.num_instances(), self.loop.config.lease_s, self.server_id, caller.name,
                                 info.max_position, self.loop.max_kv_pages_per_instance,
                                 0 if self.loop.config.prefill_chunk_tokens else  # chunked: any length
                                 min(r.info.max_batch_tokens for r in self.loop.replicas))

    def _metrics(self, _caller, _req) -> c.MetricsReply:
        return c.MetricsReply(self.loop.metrics.render().decode())

    def _stats(self, _caller, _req) -> c.StatsReply:
        snapshot = self.loop.snapshot()
        s = snapshot.stats
        return c.StatsReply(s.num_batches, s.num_commands, s.num_horizontal_batches, s.num_vertical_batches,
                            s.mean_batch_size, snapshot.num_free_kv_pages, snapshot.num_free_embeds,
                            snapshot.num_free_host_slots, snapshot.num_swapped_out, snapshot.num_swapped_in,
                            snapshot.num_discarded, snapshot.interception_policy, snapshot.profile,
                            snapshot.device_s, snapshot.rewrite_s, snapshot.intercepted_page_s,
                            snapshot.contended_page_s, snapshot.num_preempted, snapshot.rewrite_page_s,
                            snapshot.copy_s, snapshot.copy_page_s,
                            [c.ReplicaStats(r.index, r.serving, r.num_instances, r.num_free_kv_pages, r.stats.num_batches,
                                            r.stats.num_commands) for r in snapshot.replicas])

    # -- clients -------------------------------------------------------------------------------

    def _operator_only(self, caller: Caller, what: str = "manage clients") -> None:
        if not caller.operator:
            raise RequestFailed("forbidden", f"only the operator may {what}")

    def _add_client(self, caller: Caller, req: c.AddClient) -> c.ClientToken:
        self._operator_only(caller)
        try:
            token = self.keyring.add(req.name)
        except AuthError as exc:
            raise RequestFailed("bad_client", str(exc)) from None
        self._admission.update(self.keyring.admitted())
        return c.ClientToken(req.name, str(token))

    def _remove_client(self, caller: Caller, req: c.RemoveClient) -> c.Ok:
        self._operator_only(caller)
        try:
            self.keyring.remove(req.name)
        except AuthError as exc:
            raise RequestFailed("bad_client", str(exc)) from None
        self._admission.update(self.keyring.admitted())
        self._forget_client(req.name)
        return c.Ok()

    def _forget_client(self, name: str) -> None:
        """What a removed client held goes with it, so a client given its name later starts with nothing:
        its instances (detached too) and their records, its exports, its program names and unfinished
        uploads."""
        for inst in [inst for inst in self.loop.instances.values() if inst.owner == name]:
            self.loop.terminate(inst.instance_id, "its client was removed", exit_code=143)
        self.loop.forget_ended(name)
        self._prune_output()
        for export in [export for export in self.loop.exports() if export.namespace == name]:
            self.loop.drop_export(export.name, namespace=name)
        self.loop.programs.forget_client(name)
        self._drop_uploads(client=name)

    def _list_clients(self, caller: Caller, _req) -> c.ClientList:
        self._operator_only(caller)
        return c.ClientList(self.keyring.names())

    # -- leases --------------------------------------------------------------------------------

    def _heartbeat(self, caller: Caller, _req) -> c.Alive:
        if (lost := self._lapsed(caller.route)) is not None:
            raise RequestFailed("dropped", lost)
        return c.Alive(self.server_id)

    def _lapsed(self, route: bytes) -> str | None:
        """What a connection dropped while it held something lost, if anything is still lost: the
        instances it launched attached were killed; the output of those it watched, unless it attached
        again. Said once, to its next heartbeat: a client that waits for events heartbeats, so it learns
        it waits in vain (its other requests are served as usual)."""
        dropped = self._dropped.pop(route, None)
        if dropped is None:
            return None
        why, killed, watched = dropped
        unwatched = [i for i in watched if self.loop.record(i) is not None and route not in self._watchers.get(i, ())]
        lost = [f"{killed} instance(s) it launched attached were killed"] if killed else []
        lost += [f"it no longer receives the output of {len(unwatched)} instance(s)"] if unwatched else []
        return f"the server dropped this connection ({why}): {' and '.join(lost)}" if lost else None

    def _expire_leases(self, now: float) -> None:
        for route, heard in list(self._last_heard.items()):
            if now - heard > self.loop.config.lease_s and not self._awaiting[route]:
                self._drop_client(route, "its client went away (lease expired)",
                                  f"it was silent for more than its {self.loop.config.lease_s:g} s lease")

    def _drop_client(self, route: bytes, reason: str, why: str) -> None:
        """Forget the connection ``route``: terminate the instances it launched attached, drop its
        unfinished uploads, stop sending it anything. ``reason`` is the killed instances' error, ``why``
        what the client's next heartbeat is told if it comes back (see :meth:`_lapsed`)."""
        owned = self._owned.pop(route, set())
        watching = [i for i, routes in self._watchers.items() if route in routes]
        watched = set(watching) - owned
        if owned or route in self.outbox.backlogs:  # a one-shot client (oven ps) leaves silently
            log.warning("dropping client %s: %s", route.hex(), reason)
        if owned or watched:
            self._dropped[route] = (why, len(owned), watched)
            if len(self._dropped) > MAX_DROPPED_ROUTES:
                del self._dropped[next(iter(self._dropped))]
        self._last_heard.pop(route, None)
        self._drop_uploads(route)
        for instance_id in watching:
            self._watchers[instance_id].discard(route)
        self.outbox.forget(route)  # after the line above, no exit event below is queued for it again
        for instance_id in owned:
            self.loop.terminate(instance_id, reason, exit_code=143)
