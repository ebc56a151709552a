"""One running inferlet: its wasmtime store, futures, resources, queues and inbox.

The control loop drives an instance in *slices*: ``start()`` once, then
``resume(ready)`` whenever a future it waits on completes. Each slice runs
under an epoch deadline, so a guest that spins is trapped at the deadline and
only that instance dies. A slice that returns no futures ends the instance.
"""

from __future__ import annotations

import enum
import re
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import wasmtime
from wasmtime import component

from .futures import FutureTable
from .guest_call import GuestExport
from .host import WasmClock

if TYPE_CHECKING:
    from oven.control.resources import ResourceTable

    from .queues import QueueState
    from .services import HostServices

_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b")
_EXIT_STATUS = re.compile(r"^Exited with i32 exit status (\d+)")


class State(enum.Enum):
    READY = "ready"  # has a slice to run
    WAITING = "waiting"  # waits on futures
    FINISHED = "finished"
    FAILED = "failed"  # its own fault: a trap, an exception, a limit it ran into
    KILLED = "killed"  # ended from outside: a client, its lease, the pool-exhaustion policy, a shutdown


@dataclass(frozen=True, slots=True)
class InstanceLimits:
    memory_bytes: int = 512 << 20  # linear memories + tables of one instance
    slice_ms: int = 2000  # epoch deadline of one start/resume slice
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
    """``host`` is all its host functions may use beyond the instance; ``resources`` and queue 0 are the
    loop's to add before the first slice."""

    def __init__(self, instance_id: str, program: str, args: list[str], owner: str, host: HostServices,
                 limits: InstanceLimits, engine: wasmtime.Engine, linker: component.Linker, comp: component.Component,
                 ticks_per_ms: float, clock: WasmClock):
        self.instance_id, self.program, self.args, self.host, self.limits = instance_id, program, args, host, limits
        self.owner = owner  # the client that launched it: its exports, topics and name are in that namespace
        self.state = State.READY
        self.exit_code: int | None = None
        self.error: str | None = None
        self.started = False
        self.started_at = 0.0  # monotonic launch time: exhaustion policies prefer older instances
        self.sequence = 0  # launch order, which breaks ties in started_at (FCFS)
        self.blocked_since: float | None = None  # parked on an allocation
        self.io_wait_since: float | None = None  # waits only on I/O since then (it is intercepted)
        self.pause_until: float | None = None  # when it said its interception ends (runtime.pause-hint)
        self.mean_interception_s: float | None = None  # how long its interceptions lasted, a running mean
        # KvPage handles moved off the device by the pool (preempted) or the interception policy: on the host
        # tier, or discarded; they come back (``Allocator.swap_in``) before it runs again.
        self.swapped_out: list[int] = []
        self.swapping = False  # pages on their way to or from the host tier: do not run
        self.output_held = False  # a client reads its output too slowly: do not run (ControlServer)
        self.waiting_on: list[int] = []
        self.stderr_tail = ""
        self.futures = FutureTable(self._on_future_ready)
        self.inbox = Inbox(limits.inbox_messages, limits.inbox_bytes)
        self.queues: dict[int, QueueState] = {}  # virtual queue id -> its state (InferenceCalls.open_queue)
        self.resources: ResourceTable | None = None
        self._slice_ticks = max(1, int(limits.slice_ms * ticks_per_ms))
        self.store = wasmtime.Store(engine)
        self.store.set_limits(memory_size=limits.memory_bytes)
        wasi = wasmtime.WasiConfig()  # no preopened folders, no sockets, no environment
        wasi.stdout_custom = lambda data: host.emit(self, "stdout", data.decode("utf-8", "replace"))
        wasi.stderr_custom = lambda data: self._stderr(data.decode("utf-8", "replace"))
        self.store.set_wasi(wasi)
        self.store.set_epoch_deadline(self._slice_ticks)
        wasm = linker.instantiate(self.store, comp)
        start, resume = wasm.get_func(self.store, "start"), wasm.get_func(self.store, "resume")
        if start is None or resume is None:
            raise wasmtime.WasmtimeError("the component does not export start and resume")
        self._start, self._resume = GuestExport(start, self.store, clock), GuestExport(resume, self.store, clock)

    def release_store(self) -> None:
        """Free the wasm store (the inferlet's linear memory) now that the instance has ended.

        The store's stdout/stderr callbacks refer back to this instance, so without this
        the memory would wait for a full pass of the cyclic collector, which is rare by design
        (``oven.control.serve.settle_heap``).
        """
        self.store = self._start = self._resume = None

    def _stderr(self, text: str) -> None:
        self.stderr_tail = (self.stderr_tail + text)[-4096:]  # the last words explain a trap (failure)
        self.host.emit(self, "stderr", text)

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

    def run_slice(self) -> None:
        """Run ``start`` or ``resume`` once; raises wasmtime.Trap/WasmtimeError if the guest fails."""
        self.store.set_epoch_deadline(self._slice_ticks)
        if not self.started:
            self.started = True
            waiting = self._start()
        else:
            waiting = self._resume(self.futures.ready(self.waiting_on))
        if self.state is State.KILLED:  # killed by a host call of this very slice
            return
        unknown = [h for h in waiting if not self.futures.is_known(h)]
        if unknown:
            raise ValueError(f"the inferlet waits on future {unknown[0]}, which it does not hold")
        self.waiting_on = list(waiting)
        if not self.waiting_on:
            self.state = State.FINISHED
            self.exit_code = self.exit_code or 0
        elif self.futures.ready(self.waiting_on):
            self.state = State.READY
        else:
            self.state = State.WAITING
            io_only = all(self.futures.get(h).io for h in self.waiting_on)
            self.io_wait_since = (self.io_wait_since or time.monotonic()) if io_only else None

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

    def last_stderr_line(self) -> str:
        """The guest's last error line on stderr (a Python exception line if there is one)."""
        lines = [line.strip() for line in self.stderr_tail.splitlines()
                 if line.strip() and not line.startswith(("note: run with", "thread '"))]
        errors = [line for line in lines if _EXCEPTION_LINE.match(line)]
        return errors[-1] if errors else (lines[-1] if lines else "")

    def failure(self, exc: Exception) -> tuple[str, int]:
        """Why a failed slice ends this instance (the trap's cause, and which limit it hit if it hit one),
        and its exit status."""
        reason, status = _trap_message(exc), 1
        last_words = self.last_stderr_line()  # a guest's own error text beats "unreachable"
        if (exited := _EXIT_STATUS.match(reason)) is not None:  # the guest exited (the Python SDK, on an exception)
            reason, last_words, status = last_words or f"exited with status {exited[1]}", "", int(exited[1])
        elif reason == "wasm trap: interrupt":  # the epoch deadline (run_slice)
            return (f"{reason}: one slice ran past the {self.limits.slice_ms} ms deadline without waiting on a "
                    "future (oven serve --slice-ms)", status)
        if "MemoryError" in self.stderr_tail:  # CPython's answer when memory.grow hits the store's limit
            reason += (f": out of memory, the instance's limit is {self.limits.memory_bytes >> 20} MiB "
                       "(oven serve --instance-memory-mib)")
        return reason + (f" ({last_words})" if last_words else ""), status

    def record(self) -> InstanceRecord:
        return InstanceRecord(self.instance_id, self.program, self.state, self.started_at, self.exit_code, self.error,
                              self.owner, self.output_held and self.alive, self.kv_state)

    @property
    def alive(self) -> bool:
        return self.state in (State.READY, State.WAITING)


def _trap_message(exc: Exception) -> str:
    """The cause of a trap ("wasm trap: interrupt"), not the backtrace wasmtime puts first."""
    text = str(exc).strip()
    if "Caused by:" in text:
        return " ".join(text.rsplit("Caused by:", 1)[1].split())
    return text.splitlines()[0] if text else type(exc).__name__
