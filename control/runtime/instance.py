"""One running inferlet as the control process keeps it: futures, resources, queues, inbox and state.

Its WebAssembly runs in a runner process (``control/runner/``); the control loop decides when it runs
a slice (``start`` once, then ``resume`` whenever a future it waits on completes), applies the host
calls the slice made (``apply.py``) and then :meth:`Instance.slice_ended` says what it waits on.
"""

from __future__ import annotations

import enum
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .futures import FutureTable

if TYPE_CHECKING:
    from oven.control.resources.table import ResourceTable

    from .queues import QueueState
    from .services import HostServices


class State(enum.Enum):
    READY = "ready"  # has a slice to run
    WAITING = "waiting"  # waits on futures
    FINISHED = "finished"
    FAILED = "failed"  # its own fault: a trap, an exception, a limit it ran into
    KILLED = "killed"  # ended from outside: a client, its lease, the pool-exhaustion policy, a shutdown


@dataclass(frozen=True, slots=True)
class InstanceLimits:
    """What the control process bounds per instance (its runner bounds its memory and its slices)."""

    max_kv_pages: int = 4096
    max_embeds: int = 4096
    inbox_messages: int = 1024
    inbox_bytes: int = 16 << 20


@dataclass(frozen=True, slots=True)
class InstanceRecord:
    """An instance as ``ps`` shows it; all that remains of an ended one (its store and memory are gone)."""

    instance_id: str
    program: str
    state: State
    started_at: float
    exit_code: int | None
    error: str | None
    owner: str
    output_held: bool = False  # running, but held until a client reads its output
    kv: str = ""  # running | preserved | swapped | discarded (Instance.kv_state); "" once ended
    cpu_s: float = 0.0  # Instance.cpu_ns
    replica: int = 0  # the inference replica it lives (lived) on
    launched_as: str = ""  # Instance.launched_as
    parent: str = ""  # the instance that launched it (children.py), "" for a client's launch

    @property
    def shown_state(self) -> str:
        """The state ``ps`` shows (proto.control.InstanceEntry.state): ``held``, else where a running
        instance's KV is when it is not simply running (``swapped``, ``discarded``, ``preserved``), else the
        State's value."""
        if self.output_held:
            return "held"
        return self.kv if self.kv in ("swapped", "discarded", "preserved") else self.state.value


class Inbox:
    """Client messages for one instance: queued until a ``receive`` future takes them.

    Bounded in messages and bytes: an instance that never reads cannot make the
    control process hold what its clients keep sending.
    """

    def __init__(self, max_messages: int = 1024, max_bytes: int = 16 << 20):
        self.max_messages, self.max_bytes = max_messages, max_bytes
        self._messages: deque[str] = deque()
        self._num_bytes = 0
        self._waiters: deque[Callable[[str], None]] = deque()

    def push(self, text: str) -> None:
        """Deliver or queue ``text``; OverflowError when the inbox is full."""
        if self._waiters:
            self._waiters.popleft()(text)
            return
        size = len(text.encode())
        if len(self._messages) >= self.max_messages or self._num_bytes + size > self.max_bytes:
            raise OverflowError(f"the instance's inbox is full ({len(self._messages)} messages, "
                                f"{self._num_bytes >> 10} KiB unread; at most {self.max_messages} and "
                                f"{self.max_bytes >> 20} MiB)")
        self._messages.append(text)
        self._num_bytes += size

    def wait(self, deliver: Callable[[str], None]) -> None:
        if self._messages:
            text = self._messages.popleft()
            self._num_bytes -= len(text.encode())
            deliver(text)
        else:
            self._waiters.append(deliver)


class Instance:
    """``host`` is all its host functions may use beyond the instance: its replica's (placement.py sets it,
    with ``replica`` and ``resources``); queue 0 is the loop's to open before the first slice."""

    def __init__(self, instance_id: str, program: str, args: list[str], owner: str, limits: InstanceLimits):
        self.instance_id, self.program, self.args, self.limits = instance_id, program, args, limits
        self.host: HostServices | None = None
        self.replica = None  # the inference replica it lives on (runtime/replica.py)
        self.placed = False  # it made a call there: it stays (placement.py)
        self.owner = owner  # the client that launched it: its exports, topics, name and runner are that client's
        self.launched_as = ""  # the name (or hash) its client launched it by, for ps (ProgramStore.shown_name)
        self.state = State.READY
        self.exit_code: int | None = None
        self.error: str | None = None
        self.started = False
        self.in_slice = False  # its runner is running a slice of it: nothing to send it until that ends
        self.started_at = 0.0  # monotonic launch time: exhaustion policies prefer older instances
        self.sequence = 0  # launch order, which breaks ties in started_at (FCFS)
        self.cpu_ns = 0  # CPU time of its slices in its runner (launch included)
        self.blocked_since: float | None = None  # parked on an allocation
        self.io_wait_since: float | None = None  # waits only on I/O since then (it is intercepted)
        self.pause_until: float | None = None  # when it said its interception ends (runtime.pause-hint)
        self.mean_interception_s: float | None = None  # how long its interceptions lasted, a running mean
        # KvPage handles moved off the device by the pool (preempted) or the interception policy: on the host
        # tier, or discarded; they come back (``Allocator.swap_in``) before it runs again.
        self.swapped_out: list[int] = []
        # Physical pages restore-discarded gave back to be rewritten, until a forward rewrites them (calls.py).
        self.rewriting_page_ids: set[int] = set()
        self.swapping = False  # pages on their way to or from the host tier: do not run
        self.output_held = False  # a client reads its output too slowly: do not run (ControlServer)
        self.waiting_on: list[int] = []
        self.futures = FutureTable(self._on_future_ready)
        self.grammars: dict[int, str] = {}  # handle -> llguidance text (host/grammars.py)
        self.decoders: dict = {}  # handle -> decoders.Decoder
        self.num_grammars_made = self.num_decoders_made = 0
        self.inbox = Inbox(limits.inbox_messages, limits.inbox_bytes)
        self.queues: dict[int, QueueState] = {}  # virtual queue id -> its state (InferenceCalls.open_queue)
        self.num_queues_opened = 0
        self.resources: ResourceTable | None = None
        # Composition (children.py): the instance that launched this one and how deep it is; the children
        # it holds by handle; who waits for this one's exit; what it sent, kept for its parent.
        self.parent: Instance | None = None
        self.depth = 0
        self.children: dict[int, Instance] = {}
        self.num_children_made = 0
        self.exit_waiters: list[Callable[[list], None]] = []
        self.messages_for_parent: list[str] = []
        self._num_bytes_for_parent = 0

    def keep_for_parent(self, message: str) -> None:
        """Keep a message it sent for its parent (a child's), within its inbox's bounds; ValueError past them."""
        if self.parent is None:
            return
        size = len(message.encode())
        if (len(self.messages_for_parent) >= self.limits.inbox_messages
                or self._num_bytes_for_parent + size > self.limits.inbox_bytes):
            raise ValueError(f"send: its parent holds {len(self.messages_for_parent)} messages of this child "
                             f"already, at most {self.limits.inbox_messages} and {self.limits.inbox_bytes >> 20} MiB")
        self.messages_for_parent.append(message)
        self._num_bytes_for_parent += size

    def queue(self, q: int) -> QueueState:
        state = self.queues.get(q)
        if state is None:
            raise ValueError(f"queue {q} does not exist in this inferlet")
        return state

    def _on_future_ready(self, handle: int) -> None:
        if self.state is State.WAITING and handle in self.waiting_on:
            self.state = State.READY
            if self.io_wait_since is not None:  # an interception ended: what the next one is expected to last
                lasted_s = time.monotonic() - self.io_wait_since
                self.mean_interception_s = (lasted_s if self.mean_interception_s is None
                                            else 0.7 * self.mean_interception_s + 0.3 * lasted_s)
                self.io_wait_since = self.pause_until = None

    def slice_ended(self, waiting: list[int]) -> None:
        """Its slice returned ``waiting`` (every handle one the runner holds): empty, it has finished;
        otherwise it is ready at once if one of them has settled (here, or already in the runner)."""
        self.in_slice = False
        if not self.alive:  # killed by a host call of this very slice
            return
        self.started = True
        self.waiting_on = list(waiting)
        if not self.waiting_on:
            self.state = State.FINISHED
            self.exit_code = self.exit_code or 0
        elif self.ready_futures():
            self.state = State.READY
        else:
            self.state = State.WAITING
            io_only = all(self.futures.get(h).io for h in self.waiting_on)
            self.io_wait_since = (self.io_wait_since or time.monotonic()) if io_only else None

    def woken_by_device(self, ready: list[int]) -> bool:
        """Whether one of ``ready`` (settled, not yet delivered) was a call to the inference process."""
        return any(self.futures.is_known(h) and not self.futures.get(h).io for h in ready)

    def ready_futures(self) -> list[int]:
        """What it waits on that has settled: here, or delivered to its runner already (no longer here)."""
        return [h for h in self.waiting_on if not self.futures.is_known(h) or self.futures.get(h).done]

    @property
    def kv_state(self) -> str:
        """Where its KV is, as ``ps`` shows it: ``swapped`` (on the host tier, or going there),
        ``discarded`` (freed, to be recomputed by the inferlet), ``preserved`` (on the device while it
        is intercepted), else ``running``; "" once ended."""
        if not self.alive:
            return ""
        if self.resources.num_offloaded and (self.swapped_out or self.swapping):
            return "swapped"
        if self.swapped_out:
            return "discarded"
        return "preserved" if self.io_idle and self.resources.num_kvpages else "running"

    @property
    def io_idle(self) -> bool:
        """Waiting on I/O only: its KV pages are idle until a message, response or timer arrives."""
        return self.state is State.WAITING and self.io_wait_since is not None

    def record(self) -> InstanceRecord:
        return InstanceRecord(self.instance_id, self.program, self.state, self.started_at, self.exit_code, self.error,
                              self.owner, self.output_held and self.alive, self.kv_state, self.cpu_ns / 1e9, self.replica.index,
                              self.launched_as, self.parent.instance_id if self.parent is not None else "")

    @property
    def alive(self) -> bool:
        return self.state in (State.READY, State.WAITING)

