"""A runner process: runs the slices of one client's inferlets for the control process.

``python -m oven.control.runner ENDPOINT`` connects a PAIR socket to ENDPOINT (which the control
process bound in a private folder), takes its :class:`~oven.proto.runner.Setup`, and then serves
:class:`~oven.proto.runner.RunSlices` until the control process goes. Its OS limits (address space,
priority) are set by the control process before it starts (``control/runtime/runners.py``); its
wasmtime engine, epoch ticker and store limits are its own, so whatever its guests do, they do to
this process alone.

Results go back in one :class:`SlicesRan` per order, or sooner when a slice ran long, so that one
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

log = logging.getLogger("oven.runner")

EPOCH_TICK_S = 0.005
NO_CALLS = msgpack.packb([])
FLUSH_AFTER_S = 0.001  # results go out once this much of an order has run, before its other slices run


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
        threading.Thread(target=self._tick_epochs, daemon=True, name="oven-epoch").start()

    def serve(self) -> None:
        while parent_alive():
            if self._held:
                message = self._held.popleft()
            elif self.sock.poll(1000):
                message = r.CODEC.decode(self.sock.recv()).message
            else:
                continue
            if isinstance(message, r.RunSlices):
                self._run(message)
            elif isinstance(message, r.Forget):
                for instance_id in message.instance_ids:
                    if (guest := self.guests.pop(instance_id, None)) is not None:
                        guest.release()

    def _run(self, order: r.RunSlices) -> None:
        results: list[r.SliceResult] = []
        since = time.monotonic()  # the first slice whose result waits in ``results`` started then
        for work in [*order.launches, *order.resumes]:
            result = self._launch(work) if isinstance(work, r.Launch) else self._resume(work)
            if result is not None:
                results.append(result)
            if results and time.monotonic() - since > FLUSH_AFTER_S:
                self._send(r.SlicesRan(results))
                results, since = [], time.monotonic()
        if results:
            self._send(r.SlicesRan(results))

    def _launch(self, launch: r.Launch) -> r.SliceResult:
        started = time.thread_time_ns()
        try:
            comp = self.programs.component(launch.program)
            guest = Guest(launch.instance_id, launch.args, self.setup, self.tokenizer, self.engine, self.linker, comp,
                          self._slice_ticks, self.clock, self._ask)
        except Exception as exc:  # a bad component, a store limit, the address space: this launch alone
            reason = " ".join(str(exc).split()) or type(exc).__name__
            return r.SliceResult(launch.instance_id, NO_CALLS, [], f"launch failed: {reason[:500]}", 1,
                                 time.thread_time_ns() - started, 0, 0, 0)
        self.guests[launch.instance_id] = guest
        return self._slice(guest, [], [], started)

    def _resume(self, resume: r.Resume) -> r.SliceResult | None:
        guest = self.guests.get(resume.instance_id)
        if guest is None:  # forgotten meanwhile
            return None
        return self._slice(guest, resume.ready, msgpack.unpackb(resume.settled, raw=False), time.thread_time_ns())

    def _slice(self, guest: Guest, ready: list[int], settled: list, started_ns: int) -> r.SliceResult:
        clock = self.clock
        wasm_ns, host_ns, num_calls = clock.in_wasm_ns, clock.in_host_ns, clock.host_calls
        self.current = guest
        try:
            waiting, failure, status = guest.run_slice(ready, settled)
        finally:
            self.current = None
        if not waiting:
            self.guests.pop(guest.instance_id, None)
            guest.release()
        return r.SliceResult(guest.instance_id, guest.take_calls(), waiting, failure, status,
                             time.thread_time_ns() - started_ns, clock.in_wasm_ns - wasm_ns,
                             clock.in_host_ns - host_ns, clock.host_calls - num_calls)

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
