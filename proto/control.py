"""Messages between clients (the ``oven`` CLI, :class:`oven.client.rpc.OvenClient`) and the control process.

Transport: ZeroMQ; the control process binds a ROUTER, clients connect a
DEALER. Requests are answered in order with one reply each (request ids
echo the client's); :class:`InstanceEvent` messages are pushed, with request
id 0, to every client attached to an instance (the one that launched it is
attached at once).

Every connection is a CurveZMQ session (see :mod:`oven.proto.auth`): a client
holds a token naming the server's public key and its own secret key, the
server admits only the clients it knows and names each one. Instances,
exports and program names belong to the client that made them; another client's
attach, send, terminate or drop gets ``forbidden``, except the ``operator``'s,
which may act on everything, publish to the shared program library
(``UploadChunk.shared``), add or remove clients, and add or remove the LoRA
adapters the server offers (any client may list them: its inferlets open them by name). ``server_id`` is new at every
start of a server: a client that sees it change knows its instances are gone.

A client holds a lease on its attached instances by sending any message at
least every ``lease_s`` seconds (from :class:`ServerInfoReply`; :class:`Heartbeat`
does nothing else). When a
lease lapses the server terminates the instances the client launched without
``detach``, forgets its attachments and drops its unfinished uploads, so a client
that vanishes leaks nothing; if it comes back, its next heartbeat is answered
``dropped``, saying what it lost (instances killed, output it no longer receives). Events and replies reach a slow client in full and in
order; meanwhile the instances it is far behind on are held (state ``held``).
Uploads are chunked (``UPLOAD_CHUNK_BYTES``) and checked against their SHA-256;
while unfinished uploads fill the server's buffer a new chunk gets ``upload_busy``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .codec import Codec

CONTROL_PROTOCOL_VERSION = 8  # 3: adapters (ListAdapters, AddAdapter, RemoveAdapter); 4: ServerInfoReply.max_context;
# 5: InstanceEntry.cpu_s; 6: InstanceEntry.replica, StatsReply.replicas; 7: Metrics, ServerInfoReply's
# max_kv_pages_per_instance and max_batch_tokens; 8: InstanceEntry.parent
DEFAULT_LEASE_S = 10.0
UPLOAD_CHUNK_BYTES = 4 << 20


@dataclass(frozen=True, slots=True)
class UploadChunk:
    """Bytes ``[offset, offset + len(data))`` of a program of ``total_bytes`` with digest ``sha256``."""

    name: str
    sha256: str
    total_bytes: int
    offset: int
    data: bytes
    shared: bool = False  # name it in the shared library (operator only), not the uploader's own names


@dataclass(frozen=True, slots=True)
class UploadReply:
    sha256: str
    received_bytes: int
    complete: bool


@dataclass(frozen=True, slots=True)
class ListPrograms:
    pass


@dataclass(frozen=True, slots=True)
class ProgramEntry:
    sha256: str
    names: list[str]
    size_bytes: int


@dataclass(frozen=True, slots=True)
class ProgramList:
    programs: list[ProgramEntry]


@dataclass(frozen=True, slots=True)
class RemoveProgram:
    """Forget a program: the caller's names for it and its right to launch it by hash (the operator's
    removal takes it from every client and the library). Its files go once no client has it; running
    instances keep their code."""

    program: str  # a name of the caller's (the library's too, for the operator) or a SHA-256


@dataclass(frozen=True, slots=True)
class Launch:
    """Answered ``Launched`` at once when the server holds the program's code in memory, else once it has
    loaded it (its compiled file, or a compile of seconds when that file is unusable)."""

    program: str  # one of the client's names, a library name, or the SHA-256 of a program it uploaded
    args: list[str]
    detach: bool = False  # keep running when this client goes away


@dataclass(frozen=True, slots=True)
class Launched:
    instance_id: str


@dataclass(frozen=True, slots=True)
class ListInstances:
    pass


@dataclass(frozen=True, slots=True)
class InstanceEntry:
    instance_id: str
    program: str  # the name its owner (or the library) has for it, else the start of its SHA-256
    state: str  # ready | waiting | held (a client is behind on its output) | preserved (intercepted: waits on I/O,
    # its KV kept on the device) | swapped (its KV on the host tier) | discarded (its KV freed, to be
    # recomputed when it runs) | finished | failed (a trap or an
    # exception: its own fault) | killed (by a client, its lease, the pool-exhaustion policy, a shutdown)
    age_s: float
    exit_code: int | None
    error: str
    owner: str  # the client that launched it
    cpu_s: float = 0.0  # CPU its slices took in its client's runner (its own code and the host calls answered there)
    replica: int = 0  # the inference replica its KV lives (lived) on (oven serve --data-parallel)
    parent: str = ""  # the instance that launched it (WIT children), "" when a client did


@dataclass(frozen=True, slots=True)
class InstanceList:
    instances: list[InstanceEntry]


@dataclass(frozen=True, slots=True)
class SendMessage:
    instance_id: str
    text: str


@dataclass(frozen=True, slots=True)
class Attach:
    """Watch an instance: first what it wrote so far (its exit too, if it ended), then what it writes."""

    instance_id: str


@dataclass(frozen=True, slots=True)
class Terminate:
    instance_id: str


@dataclass(frozen=True, slots=True)
class ListExports:
    pass


@dataclass(frozen=True, slots=True)
class ExportEntry:
    name: str
    num_pages: int
    exporter: str  # instance id; "" for a named snapshot (its client's, kept until dropped)
    exporter_running: bool  # False: an orphan, dropped first when the KvPage pool runs out
    owner: str  # the exporter's client: its inferlets alone may import the export


@dataclass(frozen=True, slots=True)
class ExportList:
    exports: list[ExportEntry]  # oldest first


@dataclass(frozen=True, slots=True)
class DropExport:
    """Release a named KvPage export; importers keep the pages they hold."""

    name: str
    owner: str = ""  # whose export ("": the caller's own; another client's: operator only)


@dataclass(frozen=True, slots=True)
class ServerInfo:
    pass


@dataclass(frozen=True, slots=True)
class ServerInfoReply:
    models: list[str]
    traits: list[str]
    page_size: int
    num_kv_pages: int
    num_embeds: int
    device: str
    dispatch_policy: str
    num_instances: int
    lease_s: float  # talk at least this often to keep non-detached instances alive
    server_id: str  # new at every start of the server
    client: str  # the name the server knows the caller by
    max_context: int = 0  # the model's positions: a prompt and its completion together take at most this many tokens
    max_kv_pages_per_instance: int = 0  # the KvPages one instance may hold (its quota, within the smallest pool)
    # the most input tokens one forward may carry (a longer prompt cannot be forwarded); 0: no such limit (the
    # server forwards a longer one in chunks)
    max_batch_tokens: int = 0


@dataclass(frozen=True, slots=True)
class Stats:
    pass


@dataclass(frozen=True, slots=True)
class Metrics:
    """The control process's Prometheus metrics (control/metrics.py); any authenticated client, as Stats."""


@dataclass(frozen=True, slots=True)
class MetricsReply:
    text: str  # Prometheus' text exposition format 0.0.4


@dataclass(frozen=True, slots=True)
class ReplicaStats:
    """One inference replica's share (oven serve --data-parallel)."""

    index: int
    serving: bool  # False while a restarted process loads its model
    num_instances: int  # living there now
    free_kv_pages: int
    num_batches: int
    num_commands: int


@dataclass(frozen=True, slots=True)
class InterceptionProfile:
    """The interception policy's cost profile (control/scheduling/profiler.py): a recompute's seconds per
    token, one page's copy to or from the host tier, and the pages copied per iteration (the swap budget).
    Each is learnt from this server's own batches, or the default until a batch of its kind was seen
    (``*_measured`` False)."""
    recompute_s_per_token: float
    swap_s_per_page: float
    swap_budget_pages: int
    recompute_measured: bool
    swap_measured: bool
    budget_measured: bool
    copies_overlap: bool = True  # the device copies beside its steps (CUDA); else a copy holds the step up

    def describe(self) -> str:
        """One line for people (``oven stats``, the benches)."""
        tag = ["measured" if m else "default" for m in (self.recompute_measured, self.swap_measured,
                                                         self.budget_measured)]
        return (f"recompute {self.recompute_s_per_token * 1e3:.3f} ms/token ({tag[0]}), swap "
                f"{self.swap_s_per_page * 1e3:.3f} ms/page ({tag[1]}, "
                f"{'beside' if self.copies_overlap else 'between'} steps), swap budget {self.swap_budget_pages} "
                f"pages ({tag[2]})")


@dataclass(frozen=True, slots=True)
class StatsReply:
    num_batches: int
    num_commands: int
    num_horizontal_batches: int
    num_vertical_batches: int
    mean_batch_size: float
    free_kv_pages: int
    free_embeds: int
    free_host_slots: int
    # The interception policy since the server started: contexts swapped out, swapped back in ahead of
    # their return, and discarded (their KV freed; the inferlet recomputes it).
    num_swapped_out: int = 0
    num_swapped_in: int = 0
    num_discarded: int = 0
    interception_policy: str = ""
    profile: InterceptionProfile | None = None
    # Seconds the inference process took over every batch (send to reply), and the part of it spent
    # on forward-text items that ask for no distribution: what the SDKs send to recompute discarded K/V.
    device_s: float = 0.0
    rewrite_s: float = 0.0
    # Memory intercepted instances kept on the device: their pages integrated over time (page-seconds).
    intercepted_page_s: float = 0.0
    contended_page_s: float = 0.0  # the same, only while memory was short (instances waited for pages, or <10% free)
    num_preempted: int = 0  # instances swapped out for an older one that needed pages (the exhaustion policy)
    # Recomputing's memory waste: each batch's recompute seconds x the KvPages of every item in it,
    # held by their instances while the recompute lengthens the step (page-seconds).
    rewrite_page_s: float = 0.0
    # Copying's: seconds of the batches that offloaded or restored pages (which run between two steps),
    # and those seconds x the device pages of the contexts that were not intercepted, kept waiting.
    copy_s: float = 0.0
    copy_page_s: float = 0.0
    replicas: list[ReplicaStats] = field(default_factory=list)  # the counts per inference replica, in order


@dataclass(frozen=True, slots=True)
class Heartbeat:
    pass


@dataclass(frozen=True, slots=True)
class Alive:
    """The reply to a heartbeat."""

    server_id: str


@dataclass(frozen=True, slots=True)
class AddClient:
    """Operator only: admit a new client ``name``; the reply holds its token, shown this once."""

    name: str


@dataclass(frozen=True, slots=True)
class ClientToken:
    name: str
    token: str


@dataclass(frozen=True, slots=True)
class RemoveClient:
    """Operator only: refuse ``name`` from now on (its running instances go on until they end)."""

    name: str


@dataclass(frozen=True, slots=True)
class ListClients:
    pass


@dataclass(frozen=True, slots=True)
class ClientList:
    names: list[str]


@dataclass(frozen=True, slots=True)
class ListAdapters:
    pass


@dataclass(frozen=True, slots=True)
class AdapterEntry:
    """A LoRA adapter the server offers (inferlets open it by ``name``)."""

    name: str
    adapter_id: int  # what open-adapter returns; the same across restarts of the inference process
    state: str  # loaded | loading | failed (then ``error`` says why)
    error: str
    packaged: bool  # ships with oven (cannot be removed)
    rank: int  # rank, targets and size once loaded (0, [], 0 before)
    target_modules: list[str]
    num_params: int


@dataclass(frozen=True, slots=True)
class AdapterList:
    adapters: list[AdapterEntry]  # by id


@dataclass(frozen=True, slots=True)
class AddAdapter:
    """Operator only: copy the PEFT LoRA folder at ``path`` (absolute, on the server's machine) into the
    server's adapter store as ``name`` and load it; answered (an :class:`AdapterEntry`) once the
    inference process has accepted it, or with ``bad_adapter`` and its reason (then nothing is kept)."""

    name: str
    path: str


@dataclass(frozen=True, slots=True)
class RemoveAdapter:
    """Operator only: unload adapter ``name`` and delete it from the store; its id is not used again,
    and forwards of running inferlets that name it fail."""

    name: str


@dataclass(frozen=True, slots=True)
class Ok:
    pass


@dataclass(frozen=True, slots=True)
class ControlError:
    # malformed | forbidden | unknown_program | unknown_instance | unknown_export | bad_upload | bad_program |
    # upload_busy | program_quota | launch_failed | too_many_instances | inbox_full | bad_client | bad_adapter |
    # dropped (to a heartbeat: the lease lapsed, or the client stopped reading, while it held instances) | ...
    code: str
    message: str


@dataclass(frozen=True, slots=True)
class InstanceEvent:
    """Pushed: ``kind`` is stdout | stderr | message | exit (then ``exit_code`` is set)."""

    instance_id: str
    kind: str
    text: str
    exit_code: int | None = None


CODEC = Codec(
    CONTROL_PROTOCOL_VERSION,
    {
        "upload": UploadChunk,
        "upload_reply": UploadReply,
        "list_programs": ListPrograms,
        "program_list": ProgramList,
        "remove_program": RemoveProgram,
        "launch": Launch,
        "launched": Launched,
        "list_instances": ListInstances,
        "instance_list": InstanceList,
        "send": SendMessage,
        "attach": Attach,
        "terminate": Terminate,
        "list_exports": ListExports,
        "export_list": ExportList,
        "drop_export": DropExport,
        "server_info": ServerInfo,
        "server_info_reply": ServerInfoReply,
        "stats": Stats,
        "stats_reply": StatsReply,
        "metrics": Metrics,
        "metrics_reply": MetricsReply,
        "heartbeat": Heartbeat,
        "alive": Alive,
        "add_client": AddClient,
        "client_token": ClientToken,
        "remove_client": RemoveClient,
        "list_clients": ListClients,
        "client_list": ClientList,
        "list_adapters": ListAdapters,
        "adapter_entry": AdapterEntry,
        "adapter_list": AdapterList,
        "add_adapter": AddAdapter,
        "remove_adapter": RemoveAdapter,
        "ok": Ok,
        "error": ControlError,
        "event": InstanceEvent,
    },
)
