"""A runner process: runs the slices of one client's inferlets for the control process.

``python -m oven.control.runner ENDPOINT`` connects a PAIR socket to ENDPOINT (which the control
process bound in a private folder), takes its :class:`~oven.proto.runner.Setup`, and then serves
:class:`~oven.proto.runner.RunSlices` until the control process goes. Its OS limits (memory, address
space, priority) are set by the control process before it starts (``control/runtime/runners.py``); its
wasmtime engine, epoch ticker and store limits are its own, so whatever its guests do, they do to
this process alone. It keeps its client's instances to their memory share itself (``memory.py``).

Slices are queued as they are ordered and run in rounds, resumes first (``Runner._run``). Results go
back in a :class:`SlicesRan` once a millisecond of slices has run, or the queue is empty, so that one
instance's long slice does not hold back the calls of the others.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections import deque
from pathlib import Path

import msgpack
import wasmtime
import zmq
from wasmtime import component

from oven.control.runtime.programs import ProgramStore, engine_config
from oven.control.tokenizer import Tokenizer
from oven.proto import runner as r
from oven.proto.lifeline import die_with_parent, parent_alive

from .guest import Ended, Guest
from .imports import WasmClock, define_imports
from .memory import SHARE_REACHED, data_bytes

log = logging.getLogger("oven.runner")

EPOCH_TICK_S = 0.005
NO_CALLS = msgpack.packb([])
FLUSH_AFTER_S = 0.001  # results go out once this much of the queue has run, before the rest runs


class Runner:
    def __init__(self, sock: zmq.Socket, setup: r.Setup):
        self.sock, self.setup = sock, setup
        self.engine = wasmtime.Engine(engine_config())
        self.programs = ProgramStore(Path(setup.program_dir), self.engine)
        self.tokenizer = Tokenizer(setup.tokenizer)
        self.linker = component.Linker(self.engine)
        self.linker.add_wasip2()
        self.clock = WasmClock()
        self.current: Guest | None = None
        define_imports(self.linker, lambda: self.current, setup.calls, self.clock)
        self.guests: dict[str, Guest] = {}
        self._slice_ticks = max(1, int(setup.slice_ms / 1000 / EPOCH_TICK_S))
        self._held: deque = deque()  # orders that arrived while a slice waited for an answer
        self._launches: deque[r.Launch] = deque()  # ordered, not run yet
        self._resumes: deque[r.Resume] = deque()
        self._results: list[r.SliceResult] = []  # run, not sent yet
        self._since = 0.0  # when the first of them started
        threading.Thread(target=self._tick_epochs, daemon=True, name="oven-epoch").start()
        self._own_bytes = data_bytes()  # the runner's own data: what its instances add is their share's

    def serve(self) -> None:
        while parent_alive():
            if self._held or self.sock.poll(1000):  # (_run leaves the queues empty)
                self._take_orders()
                self._run()

    def _take_orders(self) -> None:
        """Queue every order that has arrived (held ones first); forget what the control process ended."""
        while self._held or self.sock.poll(0):
            message = self._held.popleft() if self._held else r.CODEC.decode(self.sock.recv()).message
            if isinstance(message, r.RunSlices):
                self._launches.extend(message.launches)
                self._resumes.extend(message.resumes)
            elif isinstance(message, r.Forget):
                self._forget(set(message.instance_ids))

    def _forget(self, instance_ids: set[str]) -> None:
        for instance_id in instance_ids:
            if (guest := self.guests.pop(instance_id, None)) is not None:
                guest.release()
        # A launch still queued is answered without being run (every slice ordered is answered).
        if dropped := [launch for launch in self._launches if launch.instance_id in instance_ids]:
            self._launches = deque(launch for launch in self._launches if launch.instance_id not in instance_ids)
            self._send(r.SlicesRan([r.SliceResult(launch.instance_id, NO_CALLS, [], "ended", 1, 0, 0, 0, 0)
                                    for launch in dropped]))

    def _run(self) -> None:
        """Run the queued slices in rounds: the resumes queued when a round starts, then one launch. A launch
        (a Python inferlet's takes 5-30 ms) then holds back the instances already running, whose calls
        fill the device's next batch, by one launch at most, and a stream of resumes cannot starve the
        launches. Orders that arrive meanwhile are queued each time results go out."""
        self._results, self._since = [], time.monotonic()
        while self._resumes or self._launches:
            for _ in range(len(self._resumes)):
                self._ran(self._resume(self._resumes.popleft()))
            if self._launches:
                self._ran(self._launch(self._launches.popleft()))
        if self._results:
            self._send(r.SlicesRan(self._results))

    def _ran(self, result: r.SliceResult) -> None:
        self._results.append(result)
        evicted = self._keep_share()
        if evicted or time.monotonic() - self._since > FLUSH_AFTER_S:  # an evicted one's last slice goes first
            self._send(r.SlicesRan(self._results))
            self._results, self._since = [], time.monotonic()
            for message in evicted:
                self._send(message)
            self._take_orders()

    def _launch(self, launch: r.Launch) -> r.SliceResult:
        started = time.thread_time_ns()
        try:
            comp = self.programs.component(launch.program)
            before = data_bytes()
            guest = Guest(launch.instance_id, launch.args, self.setup, self.tokenizer, self.engine, self.linker, comp,
                          self._slice_ticks, self.clock, self._ask)
            guest.grown_bytes = data_bytes() - before
        except Exception as exc:  # a bad component, a store limit, the address space: this launch alone
            reason = " ".join(str(exc).split()) or type(exc).__name__
            return r.SliceResult(launch.instance_id, NO_CALLS, [], f"launch failed: {reason[:500]}", 1,
                                 time.thread_time_ns() - started, 0, 0, 0)
        self.guests[launch.instance_id] = guest
        return self._slice(guest, [], [], started)

    def _resume(self, resume: r.Resume) -> r.SliceResult:
        guest = self.guests.get(resume.instance_id)
        if guest is None:  # evicted here (the control process is told): every slice ordered is answered
            return r.SliceResult(resume.instance_id, NO_CALLS, [], "evicted", 1, 0, 0, 0, 0)
        return self._slice(guest, resume.ready, msgpack.unpackb(resume.settled, raw=False), time.thread_time_ns())

    def _slice(self, guest: Guest, ready: list[int], settled: list, started_ns: int) -> r.SliceResult:
        clock = self.clock
        wasm_ns, host_ns, num_calls = clock.in_wasm_ns, clock.in_host_ns, clock.host_calls
        self.current = guest
        before = data_bytes()
        try:
            waiting, failure, status = guest.run_slice(ready, settled)
        finally:
            self.current = None
        guest.grown_bytes += data_bytes() - before
        if not waiting:
            self.guests.pop(guest.instance_id, None)
            guest.release()
        return r.SliceResult(guest.instance_id, guest.take_calls(), waiting, failure, status,
                             time.thread_time_ns() - started_ns, clock.in_wasm_ns - wasm_ns,
                             clock.in_host_ns - host_ns, clock.host_calls - num_calls)

    def _keep_share(self) -> list[r.Evicted]:
        """While the client's instances together hold more than their share, end the one that grew the most
        (its memory goes at once); the others go on. Run after every launch and slice, so the runner's data
        stays below its RLIMIT_DATA by the reserve the control process left its own heap."""
        evicted = []
        while self.guests and data_bytes() - self._own_bytes > self.setup.share_bytes:
            guest = self.guests.pop(max(self.guests, key=lambda i: self.guests[i].grown_bytes))
            guest.release()
            evicted.append(r.Evicted(guest.instance_id, f"ended at {guest.grown_bytes >> 20} MiB, the most of "
                                                        f"its client's instances: {SHARE_REACHED}"))
        return evicted

    def _ask(self, instance_id: str, calls: bytes):
        """Send a slice's calls so far; wait for the value of the last (orders that arrive meanwhile wait)."""
        self._send(r.Ask(instance_id, calls))
        while True:
            if not self.sock.poll(1000):
                if not parent_alive():
                    raise SystemExit(0)
                continue
            message = r.CODEC.decode(self.sock.recv()).message
            if not isinstance(message, r.Answer):
                self._held.append(message)
                continue
            if message.ended:
                raise Ended()
            return msgpack.unpackb(message.value, raw=False)

    def _send(self, message) -> None:
        self.sock.send(r.CODEC.encode(message))

    def _tick_epochs(self) -> None:
        while True:
            time.sleep(EPOCH_TICK_S)
            self.engine.increment_epoch()


def main(argv: list[str]) -> int:
    die_with_parent()
    logging.basicConfig(level=logging.WARNING, format="oven runner: %(message)s")
    if len(argv) != 1:
        print("usage: python -m oven.control.runner ENDPOINT", file=sys.stderr)
        return 2
    sock = zmq.Context.instance().socket(zmq.PAIR)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(argv[0])
    setup = r.CODEC.decode(sock.recv()).message
    if not isinstance(setup, r.Setup):
        print(f"oven runner: expected setup, got {type(setup).__name__}", file=sys.stderr)
        return 2
    runner = Runner(sock, setup)
    runner._send(r.RunnerReady(os.getpid()))
    try:
        runner.serve()
    except KeyboardInterrupt:
        pass
    return 0
