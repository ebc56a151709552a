"""Messages between clients (the ``oven`` CLI, :class:`oven.client.rpc.OvenClient`) and the control process.

Transport: ZeroMQ; the control process binds a ROUTER, clients connect a
DEALER. Requests are answered in order with one reply each (request ids
echo the client's); :class:`InstanceEvent` messages are pushed, with request
id 0, to every client attached to an instance (the one that launched it is
attached at once).

A client holds a lease on its attached instances by sending any message at
least every ``lease_s`` seconds (from :class:`ServerInfoReply`; :class:`Heartbeat`
does nothing else). When a
lease lapses the server terminates the instances the client launched without
``detach``, forgets its attachments and drops its unfinished uploads, so a client
that vanishes leaks nothing. Events and replies reach a slow client in full and in
order; meanwhile the instances it is far behind on are held (state ``held``).
Uploads are chunked (``UPLOAD_CHUNK_BYTES``) and checked against their SHA-256;
while unfinished uploads fill the server's buffer a new chunk gets ``upload_busy``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .codec import Codec

CONTROL_PROTOCOL_VERSION = 1
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
class Launch:
    program: str  # a name given at upload, or a SHA-256
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
    program: str
    state: str  # ready | waiting | held (a watching client is behind on its output; not run) | finished | killed
    age_s: float
    exit_code: int | None
    error: str


@dataclass(frozen=True, slots=True)
class InstanceList:
    instances: list[InstanceEntry]


@dataclass(frozen=True, slots=True)
class SendMessage:
    instance_id: str
    text: str


@dataclass(frozen=True, slots=True)
class Attach:
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
    exporter: str  # instance id
    exporter_running: bool  # False: an orphan, dropped first when the KvPage pool runs out


@dataclass(frozen=True, slots=True)
class ExportList:
    exports: list[ExportEntry]  # oldest first


@dataclass(frozen=True, slots=True)
class DropExport:
    """Release a named KvPage export; importers keep the pages they hold."""

    name: str


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


@dataclass(frozen=True, slots=True)
class Stats:
    pass


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


@dataclass(frozen=True, slots=True)
class Heartbeat:
    pass


@dataclass(frozen=True, slots=True)
class Ok:
    pass


@dataclass(frozen=True, slots=True)
class ControlError:
    code: str  # malformed | unknown_program | unknown_instance | unknown_export | bad_upload | launch_failed | ...
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
        "heartbeat": Heartbeat,
        "ok": Ok,
        "error": ControlError,
        "event": InstanceEvent,
    },
)

REQUESTS = (UploadChunk, ListPrograms, Launch, ListInstances, SendMessage, Attach, Terminate, ListExports, DropExport,
            ServerInfo, Stats, Heartbeat)
