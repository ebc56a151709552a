"""Messages between the control process and its runner processes, which run the inferlets' wasm.

Transport: ZeroMQ PAIR over an ipc endpoint in a folder only the server's user may enter; the
control process binds one per runner, its runner connects. Every frame is one envelope of
:data:`CODEC`.

The control process owns every instance's bookkeeping (futures, queues, pages, inbox) and decides
when each instance runs; a runner holds the instances' wasmtime stores and runs their slices. One
:class:`RunSlices` per runner per turn carries every slice the control process wants run there; the
runner queues them and answers each slice once, in :class:`SlicesRan` messages in the order it ran them
(not the order they were ordered: resumes go ahead of launches, control/runner/process.py), each
:class:`SliceResult` carrying the host calls the slice made that the control process answers (``calls``),
in the order the guest made them, for the control process to apply as if they had been made on its own
thread. A :class:`Forget` drops an instance's queued launch, which is answered without being run.

Host calls answered in the runner itself (poll, take-*, arguments, clocks, tokenize) never cross.
Calls that return a future get their handle from the runner at once; the control process creates its
futures in the same order, so the handles agree, and it checks that they do. A call whose value the
guest needs before it can go on (``export-kvpages``, ``open-adapter``, ...) is an :class:`Ask`: the
runner sends the slice's calls so far and waits for the :class:`Answer`.

``calls`` is msgpack of ``[[name, [args...], expected], ...]``: ``name`` a WIT function name (or
``stdout`` / ``stderr`` for the guest's WASI output), ``expected`` the future handle or queue id the
runner gave the guest, else nil. ``Resume.settled`` is msgpack of ``[[handle, kind, value, error],
...]``: the futures that settled since the instance's last slice.
"""

from __future__ import annotations

from dataclasses import dataclass

from .codec import Codec
from .inference import TokenizerSpec

PROTOCOL_VERSION = 1

# What a forwarded host call gives the guest at once (CallSpec.reply).
REPLY_NONE, REPLY_FUTURE, REPLY_QUEUE, REPLY_VALUE = "none", "future", "queue", "value"


@dataclass(frozen=True, slots=True)
class CallSpec:
    """A host function the control process answers: WIT ``interface`` and ``name``, and ``reply``."""

    interface: str
    name: str
    reply: str


@dataclass(frozen=True, slots=True)
class Setup:
    """control -> runner, first: what every instance of this runner sees of the server."""

    program_dir: str  # the program store, whose compiled files the runner reads (HMAC-checked)
    model_name: str
    traits: list[str]
    page_size: int
    vocab_size: int
    tokenizer: TokenizerSpec  # InfoReply.tokenizer
    calls: list[CallSpec]  # every host function but those the runner answers itself
    memory_bytes: int  # one linear memory's limit
    slice_ms: int  # one slice's epoch deadline
    share_bytes: int  # the memory of all its instances together (the client's share, control/runner/memory.py)


@dataclass(frozen=True, slots=True)
class Launch:
    instance_id: str
    program: str  # digest
    args: list[str]


@dataclass(frozen=True, slots=True)
class Resume:
    instance_id: str
    ready: list[int]
    settled: bytes


@dataclass(frozen=True, slots=True)
class RunSlices:
    """control -> runner: instantiate and start ``launches``, resume ``resumes``."""

    launches: list[Launch]
    resumes: list[Resume]


@dataclass(frozen=True, slots=True)
class Forget:
    """control -> runner: drop these instances' stores, and their launches not run yet (ended from outside)."""

    instance_ids: list[str]


@dataclass(frozen=True, slots=True)
class Answer:
    """control -> runner: the value of the asking call (msgpack); ``ended``: the instance is gone."""

    value: bytes
    ended: bool


@dataclass(frozen=True, slots=True)
class SliceResult:
    instance_id: str
    calls: bytes
    waiting: list[int]  # empty: the instance ended (finished, or failed if ``failure``)
    failure: str  # "" unless the slice trapped, exited non-zero or could not start
    exit_status: int
    cpu_ns: int  # CPU time of the slice's thread
    wasm_ns: int  # wall time inside the guest's export
    host_ns: int  # of which inside host functions
    num_host_calls: int


@dataclass(frozen=True, slots=True)
class SlicesRan:
    """runner -> control."""

    results: list[SliceResult]


@dataclass(frozen=True, slots=True)
class Ask:
    """runner -> control: apply ``calls``; the last one's value is wanted (:class:`Answer`)."""

    instance_id: str
    calls: bytes


@dataclass(frozen=True, slots=True)
class Evicted:
    """runner -> control: the runner ended this instance between its slices, for ``failure`` (its client's
    instances together held more than their share); a slice ordered for it since is answered as failed."""

    instance_id: str
    failure: str


@dataclass(frozen=True, slots=True)
class RunnerReady:
    """runner -> control, once set up."""

    pid: int


CODEC = Codec(PROTOCOL_VERSION, {
    "setup": Setup, "run": RunSlices, "forget": Forget, "answer": Answer,
    "ran": SlicesRan, "ask": Ask, "ready": RunnerReady, "evicted": Evicted,
})
