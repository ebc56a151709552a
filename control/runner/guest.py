"""One inferlet instance in a runner: its wasmtime store, its futures as the guest sees them, and the
calls of the slice it is running.

The control process drives it in *slices*: ``start()`` once, then ``resume(ready)`` whenever a future
it waits on completes. Each slice runs under an epoch deadline, so a guest that spins is trapped at
the deadline and only that instance dies.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import msgpack
import wasmtime
from wasmtime import component

from oven.control.runtime.futures import TOKEN, FutureTable, token_of
from oven.proto import runner as r

from .guest_call import GuestExport
from .imports import WasmClock
from .memory import SHARE_REACHED, data_left

_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b")
_EXIT_STATUS = re.compile(r"^Exited with i32 exit status (\d+)")
_UNREACHABLE = "wasm `unreachable` instruction executed"  # a Rust inferlet's abort or panic
_ERROR_SENT = "error: "

# What one store may create: a component needs a few core instances, memories and tables (a Python
# inferlet: 2 memories, 9 instances); the caps stop one that asks for hundreds of each (every memory
# reserves 4 GiB of address space, see control/runtime/runners.py) before it is instantiated.
MAX_INSTANCES, MAX_MEMORIES, MAX_TABLES, MAX_TABLE_ELEMENTS = 64, 8, 64, 1 << 20
TABLE_ELEMENT_BYTES = 8  # a funcref or an externref in wasmtime's tables (on the runner's heap)
# The calls one slice sends to the control process (its output included), roughly counted in bytes.
MAX_SLICE_CALL_BYTES = 16 << 20


def store_bytes(memory_bytes: int) -> int:
    """The most one store may hold: its memories and tables at their limits."""
    return MAX_MEMORIES * memory_bytes + MAX_TABLES * MAX_TABLE_ELEMENTS * TABLE_ELEMENT_BYTES


class Ended(Exception):
    """The control process ended this instance while it waited for an answer."""


class Guest:
    """``ask(instance_id, calls)`` sends the slice's calls so far and returns the last one's value."""

    def __init__(self, instance_id: str, args: list[str], setup: r.Setup, tokenizer, engine: wasmtime.Engine,
                 linker: component.Linker, comp: component.Component, slice_ticks: int, clock: WasmClock,
                 ask: Callable[[str, bytes], object]):
        self.instance_id, self.args, self.setup, self.tokenizer = instance_id, args, setup, tokenizer
        self._ask, self._slice_ticks, self.clock = ask, slice_ticks, clock
        self.futures = FutureTable(lambda handle: None, delivers=False)
        self.calls: list[list] = []  # [name, args, expected] of this slice, for the control process
        self._call_bytes = 0
        self._next_queue = 1  # queue 0 exists from the start
        self.grammars: set[int] = set()  # handles held (grammars.py); made ones count up, never reused
        self.decoders: set[int] = set()
        self.num_grammars_made = self.num_decoders_made = 0
        self.stderr_tail = ""
        self.grown_bytes = 0  # what its launch and slices added to the runner's data (its memories, mostly)
        self.store = wasmtime.Store(engine)
        self.store.set_limits(memory_size=setup.memory_bytes, table_elements=MAX_TABLE_ELEMENTS,
                              instances=MAX_INSTANCES, tables=MAX_TABLES, memories=MAX_MEMORIES)
        wasi = wasmtime.WasiConfig()  # no preopened folders, no sockets, no environment
        wasi.stdout_custom = lambda data: self.forward("stdout", (data.decode("utf-8", "replace"),), None)
        wasi.stderr_custom = self._stderr
        self.store.set_wasi(wasi)
        self.store.set_epoch_deadline(slice_ticks)
        wasm = linker.instantiate(self.store, comp)
        start, resume = wasm.get_func(self.store, "start"), wasm.get_func(self.store, "resume")
        if start is None or resume is None:
            raise wasmtime.WasmtimeError("the component does not export start and resume")
        self._start, self._resume = GuestExport(start, self.store, clock), GuestExport(resume, self.store, clock)
        self.started = False

    def release(self) -> None:
        """Free the store (the inferlet's linear memory) now; its callbacks refer back to this guest, so
        without this the memory would wait for a full pass of the cyclic collector."""
        self.store = self._start = self._resume = None

    # -- host calls ------------------------------------------------------------------------------

    def forward(self, name: str, args: tuple, expected: int | None):
        """Record a call for the control process; the guest gets ``expected`` back."""
        self._call_bytes += 16 + sum(len(a) if isinstance(a, (str, bytes, list)) else 8 for a in args)
        if self._call_bytes > MAX_SLICE_CALL_BYTES:
            raise ValueError(f"one slice made more than {MAX_SLICE_CALL_BYTES >> 20} MiB of calls and output "
                             "without waiting on a future")
        self.calls.append([name, list(args), expected])
        return expected

    def ask(self, name: str, args: tuple):
        """A call whose value the guest needs now: the control process applies this slice's calls so far
        and answers."""
        self.forward(name, args, None)
        return self._ask(self.instance_id, self.take_calls())

    def known_tokens(self, tokens: list[int], input_futures: list[int]) -> tuple[list[int], list[int]]:
        """``forward-sample``'s tokens and input futures, each input future whose token was delivered here
        replaced by that token: the control process forgot it when it delivered it (a failed one is
        passed on, and fails the call there as a future it does not hold)."""
        if not input_futures:
            return tokens, input_futures
        tokens, input_futures = list(tokens), list(input_futures)
        for i, handle in enumerate(input_futures):
            if handle and self.futures.is_known(handle):
                fut = self.futures.get(handle)
                if fut.done and fut.error is None and fut.kind == TOKEN:
                    tokens[i], input_futures[i] = token_of(fut.value), 0
        return tokens, input_futures

    def new_queue(self) -> int:
        self._next_queue += 1
        return self._next_queue - 1

    def take_calls(self) -> bytes:
        calls = msgpack.packb(self.calls, use_bin_type=True)
        self.calls, self._call_bytes = [], 0
        return calls

    def _stderr(self, data: bytes) -> None:
        text = data.decode("utf-8", "replace")
        self.stderr_tail = (self.stderr_tail + text)[-4096:]  # the last words explain a trap (failure)
        self.forward("stderr", (text,), None)

    # -- slices ----------------------------------------------------------------------------------

    def run_slice(self, ready: list[int], settled: list[list]) -> tuple[list[int], str, int]:
        """Settle ``settled`` ([handle, kind, value, error]), run ``start`` or ``resume(ready)``; return
        (futures waited on, failure or "", exit status). Nothing waited on and no failure: finished."""
        for handle, kind, value, error in settled:
            self.futures.settle_delivered(handle, kind, value, error)
        self.store.set_epoch_deadline(self._slice_ticks)
        try:
            if not self.started:
                self.started = True
                waiting = self._start()
            else:
                waiting = self._resume(ready)
        except Ended:
            return [], "ended while it waited for the server", 1
        except Exception as exc:  # a trap, a host function's error, a limit: the guest's own fault
            return [], *self.failure(exc)
        unknown = [h for h in waiting if not self.futures.is_known(h)]
        if unknown:
            return [], f"the inferlet waits on future {unknown[0]}, which it does not hold", 1
        return list(waiting), "", 0

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
        elif _UNREACHABLE in reason and (said := self._error_sent()):  # the Rust SDK: main's Err, or a panic
            reason, last_words = said, ""
        elif reason == "wasm trap: interrupt":  # the epoch deadline (run_slice)
            return (f"{reason}: one slice ran past the {self.setup.slice_ms} ms deadline without waiting on a "
                    "future (oven serve --slice-ms)", status)
        if "MemoryError" in self.stderr_tail:  # CPython's answer when memory.grow fails
            # A grow fails at the instance's limit; at the runner's RLIMIT_DATA only if its own heap left
            # the client less than its share (the runner ends instances past the share between slices).
            if data_left() < self.setup.memory_bytes:
                reason += f": {SHARE_REACHED}"
            else:
                reason += (f": out of memory, the instance's limit is {self.setup.memory_bytes >> 20} MiB "
                           "(oven serve --instance-memory-mib)")
        return reason + (f" ({last_words})" if last_words else ""), status

    def _error_sent(self) -> str:
        """The last "error: ..." message this slice sent its client, without the prefix ("" if none): what
        a Rust inferlet says before it traps, having no stderr (sdk/rust/oven/src/executor.rs)."""
        sent = [args[0] for name, args, _ in self.calls if name == "send" and args[0].startswith(_ERROR_SENT)]
        return sent[-1][len(_ERROR_SENT):] if sent else ""


def _trap_message(exc: Exception) -> str:
    """The cause of a trap ("wasm trap: interrupt"), not the backtrace wasmtime puts first."""
    text = str(exc).strip()
    if "Caused by:" in text:
        return " ".join(text.rsplit("Caused by:", 1)[1].split())
    return text.splitlines()[0] if text else type(exc).__name__
