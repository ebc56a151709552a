"""Runner processes, one per client: started, limited, watched and stopped by the control process.

A runner (``control/runner/``) runs the WebAssembly of one client's instances, so whatever they do
costs that client alone: its CPU is the runner's (shared with other clients' runners by the OS
scheduler, and at a lower priority while it uses much, see BUSY_SHARE), its memory is its client's
share (``oven serve --client-memory-mib``: the runner ends the instances that pass it, and its
``RLIMIT_DATA`` backs that), and a crash or a stall ends that runner and its instances only. The
control loop polls each runner's socket and its ``pidfd`` (which turns readable when the process
exits), and kills a runner that has slices to run and has said nothing for longer than a slice may
last.

One spare runner is kept started, so a client's first launch does not wait for a Python process to
start and import wasmtime.
"""

from __future__ import annotations

import logging
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import zmq

from oven.control.runner.guest import MAX_MEMORIES, store_bytes
from oven.proto import runner as r
from oven.proto.endpoints import PRIVATE_PREFIX
from oven.proto.lifeline import lifeline_env

log = logging.getLogger(__name__)

# A runner whose slice thread ran more than BUSY_SHARE of the last BALANCE_S (of the time it was not
# waiting for a CPU) runs at BUSY_NICE, below the control and inference processes and other clients'
# runners, until that falls under half: a tenant that spins takes what the others leave, while a light
# or merely busy one keeps the priority that lets its slices answer within a device step (at a lower
# priority from the start, 16 lockstep instances lost a third of their batch fill on two cores).
BUSY_SHARE, BUSY_NICE, BALANCE_S = 0.8, 10, 1.0
# A runner's RLIMIT_DATA (private writable memory: what linear memories grow into, not what they reserve)
# is its client's share, what one slice may add before the runner ends instances past the share (one
# store's memories and tables at their limits: control/runner/memory.py), and RUNNER_HEAP, the runner's
# own heap (Python, wasmtime, the tokenizer, its threads: 110 MiB started) with the rest as a reserve, so
# that its own allocations never meet the limit (they would fail, and the runner hang). A Python
# instance takes about 12 MiB of the share.
RUNNER_HEAP = 1 << 30
# Its RLIMIT_AS counts reservations, and each linear memory reserves wasmtime's default 4 GiB and a 32 MiB
# guard on each side (MEMORY_SPAN): the limit is what the store limits let one runner reserve, every
# instance of the server with MAX_MEMORIES memories (by default 1,024 x 8 x 4.06 GiB: 32.5 TiB, a quarter
# of the 128 TiB a process may map), above its data and CODE_SPACE (libraries, compiled programs).
MEMORY_SPAN = (4 << 30) + (64 << 20)
CODE_SPACE = 4 << 30
MAX_MESSAGE_BYTES = 64 << 20  # one message from a runner (a slice sends at most 16 MiB of calls)


# A runner that has reported nothing for this long is taken to be in a long slice, unless it has not had
# this much CPU since (a crowded machine: with two cores, a test suite's other worker often takes them).
SILENT_S = 0.005


class RunnerLost(Exception):
    pass


class Runner:
    """One runner process and the control side of its socket."""

    def __init__(self, setup: r.Setup, max_instances: int):
        self.folder = Path(tempfile.mkdtemp(prefix=PRIVATE_PREFIX))  # only this user may enter it
        endpoint = f"ipc://{self.folder / 'runner.sock'}"
        self.sock = zmq.Context.instance().socket(zmq.PAIR)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        self.sock.bind(endpoint)
        env = {**os.environ, **lifeline_env(), "MALLOC_ARENA_MAX": "2"}
        # A session of its own, like the inference process: a Ctrl-C reaches the control process alone.
        self.proc = subprocess.Popen([sys.executable, "-m", "oven.control.runner", endpoint],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=env,
                                     start_new_session=True)
        self.pid = self.proc.pid
        try:  # set from here, so the runner's own code cannot skip them
            data = setup.share_bytes + store_bytes(setup.memory_bytes) + RUNNER_HEAP
            resource.prlimit(self.pid, resource.RLIMIT_DATA, (data,) * 2)
            reserved = max_instances * MAX_MEMORIES * MEMORY_SPAN
            resource.prlimit(self.pid, resource.RLIMIT_AS, (data + reserved + CODE_SPACE,) * 2)
            resource.prlimit(self.pid, resource.RLIMIT_CORE, (0, 0))
        except OSError as exc:  # it died at once; the pidfd says so
            log.warning("could not limit runner %d: %s", self.pid, exc)
        self.pidfd = os.pidfd_open(self.pid)
        self.sock.send(r.CODEC.encode(setup))
        self.client: str | None = None  # whose instances it runs (None: the spare)
        self.instance_ids: set[str] = set()
        self.num_in_slice = 0  # slices ordered and not reported
        self.heard_at = time.monotonic()  # its last message, or the order that gave an idle runner work
        self.idle_since = time.monotonic()
        self.busy = False  # running at BUSY_NICE
        self._silent_since: tuple[float, float] | None = None  # (heard_at, its CPU seconds) when seen silent
        self._on_cpu_s = self._waited_s = 0.0
        self._balanced_at = time.monotonic()

    def balance(self, now: float) -> None:
        """Lower or restore its priority by how much its slice thread ran (BUSY_SHARE)."""
        times = self._schedstat()
        if times is None:
            return
        on_cpu_s, waited_s = times
        # Time spent waiting for a CPU is not held against it: on a crowded machine every runner waits.
        available_s = now - self._balanced_at - (waited_s - self._waited_s)
        share = (on_cpu_s - self._on_cpu_s) / max(available_s, 1e-3)
        self._on_cpu_s, self._waited_s, self._balanced_at = on_cpu_s, waited_s, now
        busy = share > BUSY_SHARE or (self.busy and share > BUSY_SHARE / 2)
        if busy != self.busy:
            try:
                os.setpriority(os.PRIO_PROCESS, self.pid, BUSY_NICE if busy else 0)
            except OSError:  # lowering back needs CAP_SYS_NICE: it stays low
                return
            self.busy = busy

    def progressing(self, now: float) -> bool:
        """Whether its slices are still coming: it reported within SILENT_S, or has since had less than
        SILENT_S of CPU (its main thread's; read once it has been silent that long)."""
        if now - self.heard_at < SILENT_S:
            return True
        times = self._schedstat()
        on_cpu_s = times[0] if times is not None else float("inf")
        if self._silent_since is None or self._silent_since[0] != self.heard_at:
            self._silent_since = (self.heard_at, on_cpu_s)
            return True
        return on_cpu_s - self._silent_since[1] < SILENT_S

    def _schedstat(self) -> tuple[float, float] | None:
        """Seconds its main thread has run on a CPU and waited in the run queue; None once it is gone."""
        try:
            on_cpu_ns, waited_ns = map(int, Path(f"/proc/{self.pid}/schedstat").read_text().split()[:2])
        except (OSError, ValueError):
            return None
        return on_cpu_ns / 1e9, waited_ns / 1e9

    def send(self, message) -> None:
        self.sock.send(r.CODEC.encode(message))

    def order(self, launches: list[r.Launch], resumes: list[r.Resume], now: float) -> None:
        if not self.num_in_slice:
            self.heard_at = now
        self.num_in_slice += len(launches) + len(resumes)
        self.send(r.RunSlices(launches, resumes))

    def receive(self) -> object | None:
        """The next message, or None; RunnerLost for one that is not a runner's message."""
        try:
            frame = self.sock.recv(zmq.NOBLOCK)
        except zmq.Again:
            return None
        self.heard_at = time.monotonic()
        try:
            return r.CODEC.decode(frame).message
        except Exception as exc:
            raise RunnerLost(f"it sent a malformed message ({exc})") from None

    def stalled(self, now: float, limit_s: float) -> bool:
        """Slices to run, and silent for ``limit_s`` (unread messages count as heard)."""
        return bool(self.num_in_slice) and now - self.heard_at > limit_s and not self.sock.poll(0)

    def exit_reason(self) -> str:
        status = self.proc.poll()
        if status is None:
            return "it stopped answering"
        return f"killed by signal {-status}" if status < 0 else f"exited with status {status}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGKILL)

    def close(self) -> None:
        self.kill()
        self.proc.wait(10)
        os.close(self.pidfd)
        self.sock.close()
        shutil.rmtree(self.folder, ignore_errors=True)


class Runners:
    """The runner of each client with running instances, and a spare; at most ``max_runners`` at once.

    ``on_started`` / ``on_closed`` (a runner) let the loop register and unregister its socket and pidfd.
    """

    def __init__(self, setup: r.Setup, max_instances: int, max_runners: int, idle_s: float,
                 on_started, on_closed):
        self._setup, self._max_instances, self.max_runners, self.idle_s = setup, max_instances, max_runners, idle_s
        self._on_started, self._on_closed = on_started, on_closed
        self.by_client: dict[str, Runner] = {}
        self.spare: Runner | None = None
        self._balanced_at = time.monotonic()
        self._keep_spare()

    def all(self) -> list[Runner]:
        return [*self.by_client.values(), *([self.spare] if self.spare is not None else [])]

    def for_client(self, client: str) -> Runner:
        """``client``'s runner, started if it has none; RuntimeError past ``max_runners``."""
        runner = self.by_client.get(client)
        if runner is not None:
            return runner
        if len(self.by_client) >= self.max_runners and not self._stop_an_idle_one():
            raise RuntimeError(f"{self.max_runners} clients have instances running, the server's maximum "
                               "(oven serve --max-runners): try again when some have ended")
        runner, self.spare = self.spare or self._start(), None
        runner.client = client
        self.by_client[client] = runner
        self._keep_spare()
        return runner

    def balance(self, now: float) -> None:
        """Every BALANCE_S: each runner's priority by its recent CPU use."""
        if now - self._balanced_at >= BALANCE_S:
            self._balanced_at = now
            for runner in self.by_client.values():
                runner.balance(now)

    def stop_idle(self, now: float) -> None:
        """Stop runners whose client has had no instance for ``idle_s``."""
        for runner in [x for x in self.by_client.values() if not x.instance_ids and now - x.idle_since > self.idle_s]:
            self.close(runner)

    def close(self, runner: Runner) -> None:
        if self.by_client.get(runner.client) is runner:
            del self.by_client[runner.client]
        if self.spare is runner:
            self.spare = None
        self._on_closed(runner)
        runner.close()

    def close_all(self) -> None:
        for runner in self.all():
            self.close(runner)

    def _stop_an_idle_one(self) -> bool:
        idle = [x for x in self.by_client.values() if not x.instance_ids]
        if not idle:
            return False
        self.close(min(idle, key=lambda x: x.idle_since))
        return True

    def _keep_spare(self) -> None:
        if self.spare is None:
            self.spare = self._start()

    def _start(self) -> Runner:
        runner = Runner(self._setup, self._max_instances)
        self._on_started(runner)
        return runner
