"""The control loop: one thread that orders inferlet slices, batches their calls and talks to inference.

Inferlets run in runner processes, one per client (``runners.py``); the loop decides when each
instance runs a slice and applies the host calls each slice made when its runner reports it.
Each turn of :meth:`ControlLoop.step`:

1. orders a slice of every instance that has a completed future it waits on, one message per runner;
2. asks the dispatch policy whether to form a batch now and, if so, sends the
   scheduler's batch to the inference process (several, under ``eager``);
   then lets the interception policy swap intercepted instances' pages out or
   back in, or discard them (runtime/interceptions.py), and, if instances wait for memory while
   the device is idle, has the allocator decide for them again;
3. completes futures from the replies that arrived, applies the slices that runners reported (and
   answers the calls they ask about), fires due timers and runs callbacks posted from other threads (HTTP);
4. blocks in ``zmq.Poller`` until a reply, a runner's report, a client request or a deadline.

The inference process answers in FIFO order, which is what makes it safe to
free memory as soon as the calls that used it have been *sent*: anything that
reuses it is sent later and so runs later.

With several inference processes (data parallel, ``oven serve --data-parallel N``) each is a
:class:`~.replica.Replica` with pools, queues and batches of its own; every instance lives on one
(``placement.py``) and each turn dispatches to each.

With a supervisor (``oven serve``), a dead or hung inference process is noticed
within a turn or two: every instance that had state in it (pages, embeds, calls
queued or in flight) ends with ``inference process died: ...`` (``inference replica K died: ...``
with several), its exports go, and a new process starts; the loop dispatches to it again once it
answers, and to the other replicas meanwhile.
"""

from __future__ import annotations

import itertools
import math
import logging
import queue
import time
from collections import Counter
from collections.abc import Sequence
from typing import Callable

import msgpack
import wasmtime
import zmq

from oven.control.adapter_store import AdapterStore
from oven.control.config import ControlConfig
from oven.control.metrics import ControlMetrics
from oven.control.inference_client import InferenceClient
from oven.control.resources.exports import Export
from oven.control.resources.slab import ResourceError
from oven.control.scheduling.batcher import SchedulerStats
from oven.proto import control as c
from oven.control.runner.imports import WasmClock
from oven.proto import inference as p
from oven.proto import runner as r
from oven.proto.auth import OPERATOR

from . import host
from .adapters import Adapters
from .apply import apply_calls
from .children import Children
from .http_client import HttpClient
from .instance import Instance, InstanceLimits, InstanceRecord, State
from .placement import Placement
from .programs import ProgramStore, engine_config
from .replica import START_TIMEOUT_S, Replica, Supervisor
from .runners import SILENT_S, Runner, RunnerLost, Runners
from .services import EventSink
from .snapshot import LoopSnapshot, ReplicaLoad
from .timers import Timers
from .topics import Topics

log = logging.getLogger(__name__)

# The adaptive policy waits for the slices of instances a batch reply woke (or a launch started), so
# that a batch holds every instance one reply woke, while their runner makes progress (Runner.progressing)
# and for WAVE_WAIT_S at most: a slow or spinning slice holds up other clients' batches by a few
# milliseconds, and a client's many slices by WAVE_WAIT_S at most. A batch the policy would send is held
# back by the wave for WAVE_WAIT_S at most too (Replica.dispatch): a client launching hundreds of instances
# orders a new slice every few milliseconds, and the wave of each held back the next, which kept the device
# idle for seconds while the commands of the client's running instances waited.
WAVE_WAIT_S = 0.05
RECHECK_S = 0.001  # how soon to look again at a silent runner that may still be progressing
MAX_RUNNER_MESSAGES_PER_TURN = 8  # from one runner, so that one client's output cannot fill every turn


class ControlLoop:
    """Owns every part of the control process but the client RPC, and drives them from one thread.

    The server reads it through :meth:`snapshot`, :meth:`record` and :meth:`num_instances`, and
    changes it only through :meth:`launch`, :meth:`terminate`, :meth:`deliver`,
    :meth:`hold_output`, :meth:`drop_export` and :attr:`adapters` (the LoRA adapters by name);
    host functions see :class:`HostServices`.
    """

    def __init__(self, clients: InferenceClient | Sequence[InferenceClient], config: ControlConfig,
                 on_event: EventSink, supervisors: Sequence[Supervisor | None] | None = None):
        """``clients``: one per inference replica (a single one for one process); ``supervisors``, one per
        client, notice dead processes and start others (``oven serve``; None for a replica no one watches)."""
        clients = [clients] if isinstance(clients, InferenceClient) else list(clients)
        self.config, self._on_event = config, on_event
        infos = [client.info() for client in clients]
        self.info: p.InfoReply = infos[0]  # the served model (every replica serves the same)
        for index, info in enumerate(infos[1:], 1):
            if (info.model_name, info.page_size, info.vocab_size) != (self.info.model_name, self.info.page_size,
                                                                      self.info.vocab_size):
                raise RuntimeError(f"inference replica {index} serves {info.model_name} with {info.page_size}-token "
                                   f"pages; replica 0 serves {self.info.model_name} with {self.info.page_size}")
        self.replicas: list[Replica] = []
        # Ids are the control process's (see adapters.py): every adapter is loaded before any batch is sent.
        self.adapters = Adapters(AdapterStore(config.adapters_path),
                                 lambda index, request: self.replicas[index].client.send(request), self.info,
                                 len(clients))
        self.timers, self.topics = Timers(), Topics()
        self._posted: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._wake_r, self._wake_w = _wake_pipe()
        self._poller = zmq.Poller()  # built once: every turn of the loop polls it
        self._poller.register(self._wake_r, zmq.POLLIN)
        self._extra_polled: set[zmq.Socket] = set()  # the sockets of step()'s last ``extra``
        self.http = HttpClient(config.http_allow_list, post=self.post, timeout_s=config.http_timeout_s,
                               per_instance=config.http_fetches_per_instance,
                               queue_per_instance=config.http_queue_per_instance, workers=config.http_workers,
                               max_body_bytes=config.http_max_body_mib << 20)
        self._limits = InstanceLimits(config.max_kv_pages_per_instance, config.max_embeds_per_instance,
                                      config.inbox_messages, config.inbox_mib << 20)
        self.placement = Placement(self.replicas, self._limits)
        self.children = Children(self.launch, self.kill, self.num_instances,
                                 lambda ref, digest, owner: self.programs.launch_name(ref, digest, owner),
                                 config.max_launch_depth, config.max_children_per_instance,
                                 config.max_instances_per_client)
        shared = dict(topics=self.topics, timers=self.timers, http=self.http, emit=on_event, placement=self.placement,
                      children=self.children)
        supervisors = supervisors or [None] * len(clients)
        self._replica_by_socket: dict[zmq.Socket, Replica] = {}
        for index, (client, info, supervisor) in enumerate(zip(clients, infos, supervisors)):
            replica = Replica(index, client, info, config, self.adapters, self.kill, shared, supervisor)
            self.replicas.append(replica)
            self._poll_replica(replica)
        self.adapters.load_stored(lambda index, request_id: self.replicas[index].client.wait_reply(
            request_id, START_TIMEOUT_S))
        self.engine = wasmtime.Engine(engine_config())  # compiles uploads; runners run them
        self.programs = ProgramStore(config.programs_path, self.engine)
        self.wasm_clock = WasmClock()  # every runner's slices, added up
        self.instances: dict[str, Instance] = {}
        self.finished: dict[str, InstanceRecord] = {}  # what `ps` shows of ended instances
        self._instance_numbers = itertools.count(1)
        setup = r.Setup(str(config.programs_path), self.info.model_name,
                        [t.replace("_", "-") for t in self.info.traits], self.info.page_size, self.info.vocab_size,
                        self.info.tokenizer, host.CALL_SPECS, config.instance_memory_mib << 20, config.slice_ms,
                        config.client_memory_mib << 20)
        self._runner_by_socket: dict[object, Runner] = {}
        # instance id -> (when its slice was ordered, its runner), oldest first: see WAVE_WAIT_S
        self._wave: dict[str, tuple[float, Runner]] = {}
        self.runners = Runners(setup, config.max_instances, config.max_runners, config.runner_idle_s,
                               on_started=self._watch_runner, on_closed=self._unwatch_runner)
        self.metrics = ControlMetrics(self.snapshot, sum(i.num_kv_pages for i in infos),
                                      sum(i.num_host_pages for i in infos), self.adapters.num_opened)
        for replica in self.replicas:
            replica.calls.metrics = self.metrics

    # -- lifecycle of instances ---------------------------------------------

    def launch(self, program: str, args: list[str], owner: str = OPERATOR) -> Instance:
        """Create an instance of a stored program for client ``owner`` (it names it, or uploaded it); its
        runner instantiates it with its first slice, and a bad component fails it then. Raises
        ProgramError for a program ``owner`` may not run, RuntimeError past ``max_instances`` or
        ``max_runners``."""
        if len(self.instances) >= self.config.max_instances:
            raise RuntimeError(f"the server runs its maximum of {self.config.max_instances} instances")
        digest = self.programs.resolve(program, owner)
        runner = self.runners.for_client(owner)
        sequence = next(self._instance_numbers)
        instance_id = f"{sequence:x}-{digest[:8]}"
        inst = Instance(instance_id, digest, list(args), owner, self._limits)
        inst.started_at, inst.sequence, inst.runner = time.monotonic(), sequence, runner
        self.placement.place(inst)
        inst.replica.calls.open_queue(inst)  # queue 0
        self.instances[instance_id] = inst
        runner.instance_ids.add(instance_id)
        self.metrics.launched(instance_id, inst.started_at)
        return inst

    def kill(self, inst: Instance, reason: str, exit_code: int = 1, state: State = State.KILLED) -> None:
        """End ``inst`` for ``reason``: ``State.KILLED`` from outside, ``State.FAILED`` for its own fault."""
        if not inst.alive:
            return
        inst.state, inst.error, inst.exit_code = state, reason, exit_code
        self._retire(inst)

    def _retire(self, inst: Instance) -> None:
        """Return everything the instance holds; fail what it still had queued; kill its children."""
        self.children.parent_ended(inst)
        replica = inst.replica
        replica.calls.drop_instance(inst)
        host.grammars.drop_all(inst)
        replica.allocator.forget(inst)
        self.http.forget(inst.instance_id)
        if inst.state is not State.FINISHED:  # its KV may be half written: no one should import it
            for export in replica.exports.exported_by(inst.instance_id):
                replica.exports.drop(export.name, export.namespace)
        inst.resources.release_all()
        self._leave_runner(inst)
        self.topics.forget(inst.instance_id)
        self.timers.forget(inst.instance_id)
        self.instances.pop(inst.instance_id, None)
        replica.instances.pop(inst.instance_id, None)
        self.finished[inst.instance_id] = inst.record()
        while len(self.finished) > self.config.finished_instances:  # oldest first (dicts keep insertion order)
            del self.finished[next(iter(self.finished))]
        self._on_event(inst, "exit", inst.exit_code)
        self.children.child_ended(inst)
        self.metrics.ended(inst.instance_id, inst.state.value, inst.started_at, time.monotonic())
        replica.allocator.retry_parked()

    # -- what the server reads and changes ----------------------------------------------

    def snapshot(self) -> LoopSnapshot:
        replicas = self.replicas
        interceptions = [r.interceptions for r in replicas]
        calls = [r.calls for r in replicas]
        stats = [r.scheduler.stats() for r in replicas]
        return LoopSnapshot(tuple(inst.record() for inst in self.instances.values()), tuple(self.finished.values()),
                            tuple(self.exports()), SchedulerStats.combined(stats),
                            sum(r.kv_pool.num_free for r in replicas), sum(r.embed_pool.num_free for r in replicas),
                            sum(r.host_pool.num_free for r in replicas), sum(i.num_swapped_out for i in interceptions),
                            sum(i.num_swapped_in for i in interceptions), sum(i.num_discarded for i in interceptions),
                            self.config.interception_policy, self.interception_profile(),
                            sum(c.device_s for c in calls), sum(c.rewrite_s for c in calls),
                            sum(i.intercepted_page_s for i in interceptions),
                            sum(i.contended_page_s for i in interceptions),
                            sum(r.allocator.num_preempted for r in replicas), sum(c.rewrite_page_s for c in calls),
                            sum(i.copy_s for i in interceptions), sum(i.copy_page_s for i in interceptions),
                            tuple(ReplicaLoad(r.index, r.serving, len(r.instances), r.kv_pool.num_free, replica_stats)
                                  for r, replica_stats in zip(replicas, stats)),
                            sum(c.num_split for c in calls), sum(c.num_chunks for c in calls))

    def exports(self) -> list[Export]:
        """Every client's exports on every replica."""
        return [export for replica in self.replicas for export in replica.exports.exports()]

    def record(self, instance_id: str) -> InstanceRecord | None:
        """The running instance ``instance_id``, or None."""
        inst = self.instances.get(instance_id)
        return inst.record() if inst is not None else None

    def ended(self, instance_id: str) -> InstanceRecord | None:
        """The ended instance ``instance_id``, if it is among the ``finished_instances`` newest, or None."""
        return self.finished.get(instance_id)

    def forget_ended(self, owner: str) -> None:
        """Forget the records of client ``owner``'s ended instances (a client removed from the server)."""
        for instance_id in [i for i, record in self.finished.items() if record.owner == owner]:
            del self.finished[instance_id]

    def num_instances(self, owner: str | None = None) -> int:
        """Instances running (launched by client ``owner``, if given)."""
        if owner is None:
            return len(self.instances)
        return sum(1 for inst in self.instances.values() if inst.owner == owner)

    @property
    def max_kv_pages_per_instance(self) -> int:
        """The KvPages one instance may hold at once: its quota, within the smallest replica's pool."""
        return min(self._limits.max_kv_pages, *(r.kv_pool.size for r in self.replicas))

    def terminate(self, instance_id: str, reason: str, exit_code: int = 143) -> None:
        """Kill the running instance ``instance_id``; nothing if it has ended."""
        if (inst := self.instances.get(instance_id)) is not None:
            self.kill(inst, reason, exit_code)

    def deliver(self, instance_id: str, text: str) -> None:
        """A client's message for ``receive``; KeyError for no running instance, OverflowError for a full inbox."""
        self.instances[instance_id].inbox.push(text)

    def hold_output(self, instance_id: str, held: bool) -> None:
        """Run no further slice of ``instance_id`` while ``held`` (a client is behind on its output)."""
        if (inst := self.instances.get(instance_id)) is not None:
            inst.output_held = held

    def drop_export(self, name: str, namespace: str = OPERATOR) -> None:
        """Release client ``namespace``'s export ``name``; ResourceError for an unknown one."""
        holder = self.placement.holder(name, namespace)
        if holder is None:
            raise ResourceError(f"no kvpage export named {name!r}")
        holder.allocator.drop_export(name, namespace=namespace)

    def post(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` on the loop thread (safe to call from any thread)."""
        self._posted.put(callback)
        self._wake_w.send(b"")

    # -- the loop --------------------------------------------------------------

    def step(self, timeout_s: float, extra: dict | None = None) -> None:
        """One turn; ``extra`` maps more zmq sockets to handlers called when they are readable."""
        for replica in self.replicas:
            if replica.allocator.num_waiting and not replica.calls.num_in_flight and not replica.scheduler.num_pending:
                # The device is idle while instances wait for memory: decide again, now that the instances
                # that were running have stopped, before their next slices are ordered (they may be swapped
                # out for the oldest; an instance in a slice is about to make calls, and is not).
                replica.allocator.retry_parked()
        self._order_slices()
        self._dispatch()
        for replica in self.replicas:
            replica.interceptions.step(replica.instances.values(), time.monotonic())
            if replica.profiler.measured != replica.profile_logged:
                self._log_profile(replica)
        self._dispatch()  # the copies it chose
        for replica in self.replicas:
            if replica.supervisor is not None:
                # a batch is judged by when its reply could have been read, not across a stall
                replica.drain_replies(self.adapters)
                if (reason := replica.watch(time.monotonic())) is not None:
                    self._inference_lost(replica, reason, time.monotonic())
        self._watch_runners(time.monotonic())
        extra = extra or {}
        if self._extra_polled != extra.keys():  # the caller's sockets changed (say, a server closed its own)
            for sock in self._extra_polled - extra.keys():
                self._poller.unregister(sock)
            for sock in extra.keys() - self._extra_polled:
                self._poller.register(sock, zmq.POLLIN)
            self._extra_polled = set(extra)
        busy = any(not i.in_slice and self._runnable(i) for i in self.instances.values())
        wait_s = 0.0 if busy else self._time_to_next_event(timeout_s)
        for sock, _ in self._poller.poll(math.ceil(wait_s * 1000)):  # a timeout of 0 would spin
            if (replica := self._replica_by_socket.get(sock)) is not None:
                replica.drain_replies(self.adapters)
            elif sock is self._wake_r:
                while self._wake_r.poll(0):
                    self._wake_r.recv()
            elif (runner := self._runner_by_socket.get(sock)) is not None:
                self._hear_runner(runner, exited=sock == runner.pidfd)
            elif sock in extra:  # (not a runner's socket that a runner lost this turn closed)
                extra[sock]()
        while not self._posted.empty():
            self._posted.get()()
        self.timers.fire_due(time.monotonic())

    def run_until(self, done: Callable[[], bool], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not done():
            if time.monotonic() > deadline:
                return False
            self.step(min(0.05, deadline - time.monotonic()))
        return True

    def _time_to_next_event(self, cap_s: float) -> float:
        now = time.monotonic()
        candidates = [cap_s]
        if (deadline := self.timers.next_deadline()) is not None:
            candidates.append(deadline - now)
        for replica in self.replicas:
            if (wake := self.config.dispatch.next_wakeup(now, replica.scheduler.oldest_enqueued_at)) is not None:
                candidates.append(wake - now)
        if self._wave and any(replica.scheduler.num_pending for replica in self.replicas):
            # when the slices the policy waits for stop counting
            candidates += [min(ordered_at + WAVE_WAIT_S, max(runner.heard_at + SILENT_S, now + RECHECK_S)) - now
                           for ordered_at, runner in self._wave.values()]
            candidates += [replica.wave_held_since + WAVE_WAIT_S - now for replica in self.replicas
                           if replica.wave_held_since is not None]
        return max(0.0, min(candidates))

    def _runnable(self, inst: Instance) -> bool:
        """Has a slice to run now: not held for its client, not swapped out and waiting for its pages,
        and, for an instance not started yet, admitted (no one waits for memory under FCFS)."""
        return (inst.state is State.READY and not (inst.output_held or inst.swapping)
                and not (inst.swapped_out and inst.replica.allocator.is_waiting(inst))
                and (inst.started or inst.replica.allocator.admitting))

    def _order_slices(self) -> None:
        """Order a slice of every runnable instance from its runner: one message per runner."""
        orders: dict[Runner, tuple[list, list]] = {}
        now = time.monotonic()
        for inst in list(self.instances.values()):
            if inst.in_slice or not self._runnable(inst):  # admission is decided per instance
                continue
            if inst.swapped_out:
                inst.replica.allocator.swap_in(inst)  # it runs once its pages are back
            if inst.swapping or inst.swapped_out or not inst.alive:
                continue
            launches, resumes = orders.setdefault(inst.runner, ([], []))
            if not inst.started:
                inst.started = True
                launches.append(r.Launch(inst.instance_id, inst.program, inst.args))
                self._wave[inst.instance_id] = (now, inst.runner)
            else:
                ready = inst.ready_futures()
                if inst.woken_by_device(ready):
                    self._wave[inst.instance_id] = (now, inst.runner)
                settled = inst.futures.deliver()
                resumes.append(r.Resume(inst.instance_id, ready, msgpack.packb(settled, use_bin_type=True)))
            inst.in_slice = True
        for runner, (launches, resumes) in orders.items():
            runner.order(launches, resumes, now)

    def _slices_ran(self, runner: Runner, results: list[r.SliceResult]) -> None:
        clock = self.wasm_clock
        for result in results:
            runner.num_in_slice -= 1
            self._wave.pop(result.instance_id, None)
            inst = self.instances.get(result.instance_id)
            if inst is None or inst.runner is not runner:  # ended meanwhile
                continue
            inst.cpu_ns += result.cpu_ns
            clock.in_wasm_ns += result.wasm_ns
            clock.in_host_ns += result.host_ns
            clock.host_calls += result.num_host_calls
            self._apply(inst, result.calls)
            inst.in_slice = False
            if result.failure:
                self.kill(inst, result.failure, result.exit_status, state=State.FAILED)
                continue
            inst.slice_ended(result.waiting)
            if inst.state is State.FINISHED:
                self._retire(inst)
        self._dispatch()

    def _apply(self, inst: Instance, calls: bytes):
        """Apply a slice's calls; an error kills ``inst`` alone (as a trap in its host call would have)."""
        try:
            return apply_calls(inst, msgpack.unpackb(calls, raw=False))
        except Exception as exc:
            text = str(exc).strip()
            self.kill(inst, text.splitlines()[0] if text else type(exc).__name__, state=State.FAILED)

    def _answer(self, runner: Runner, ask: r.Ask) -> None:
        """A slice asks for the value of its last call: apply its calls so far and answer."""
        inst = self.instances.get(ask.instance_id)
        value = None
        if inst is not None and inst.runner is runner and inst.alive:
            value = self._apply(inst, ask.calls)
        ended = inst is None or not inst.alive
        runner.send(r.Answer(b"" if ended else msgpack.packb(value, use_bin_type=True), ended))

    # -- runners ---------------------------------------------------------------------------------

    def _watch_runner(self, runner: Runner) -> None:
        for fd in (runner.sock, runner.pidfd):
            self._poller.register(fd, zmq.POLLIN)
            self._runner_by_socket[fd] = runner

    def _unwatch_runner(self, runner: Runner) -> None:
        for fd in (runner.sock, runner.pidfd):
            self._poller.unregister(fd)
            self._runner_by_socket.pop(fd, None)

    def _hear_runner(self, runner: Runner, exited: bool = False) -> None:
        try:
            for _ in range(MAX_RUNNER_MESSAGES_PER_TURN):
                message = runner.receive()
                if message is None:
                    break
                if isinstance(message, r.SlicesRan):
                    self._slices_ran(runner, message.results)
                elif isinstance(message, r.Ask):
                    self._answer(runner, message)
                elif isinstance(message, r.Evicted):
                    self._evicted(runner, message)
        except RunnerLost as exc:
            runner.kill()
            self._runner_lost(runner, str(exc))
            return
        if exited:
            self._runner_lost(runner, runner.exit_reason())

    def _evicted(self, runner: Runner, evicted: r.Evicted) -> None:
        """The runner ended an instance between its slices (its client's share); it has freed its store."""
        inst = self.instances.get(evicted.instance_id)
        if inst is not None and inst.runner is runner:
            self.kill(inst, evicted.failure, state=State.FAILED)

    def _watch_runners(self, now: float) -> None:
        limit_s = self.config.slice_ms / 1000 + self.config.runner_grace_s
        for runner in self.runners.all():
            if runner.stalled(now, limit_s):
                runner.kill()
                self._runner_lost(runner, f"it said nothing for {now - runner.heard_at:.1f} s with slices to run")
        self.runners.balance(now)
        self.runners.stop_idle(now)

    def _runner_lost(self, runner: Runner, reason: str) -> None:
        """A runner died or was killed: its instances end (their owners are told why); the next launch
        of its client starts another."""
        who = f"client {runner.client!r}" if runner.client is not None else "the spare"
        log.error("the runner process of %s (pid %d) is gone: %s", who, runner.pid, reason)
        self.runners.close(runner)
        for instance_id in list(runner.instance_ids):
            if (inst := self.instances.get(instance_id)) is not None:
                self.kill(inst, f"its runner process died: {reason}")

    def _leave_runner(self, inst: Instance) -> None:
        runner = inst.runner
        runner.instance_ids.discard(inst.instance_id)
        if not runner.instance_ids:
            runner.idle_since = time.monotonic()
        if runner.proc.poll() is None:
            runner.send(r.Forget([inst.instance_id]))

    def _dispatch(self) -> None:
        # The slices of this wave still running: each may add a call to its replica's batch (WAVE_WAIT_S).
        wave, now = self._wave, time.monotonic()
        while wave and next(iter(wave.values()))[0] < now - WAVE_WAIT_S:  # oldest first
            del wave[next(iter(wave))]
        progressing = {runner: runner.progressing(now) for _, runner in wave.values()}  # each reads /proc
        to_run = Counter(self.instances[instance_id].replica.index for instance_id, (_, runner) in wave.items()
                         if instance_id in self.instances and progressing[runner])
        for replica in self.replicas:
            replica.dispatch(to_run[replica.index], time.monotonic, WAVE_WAIT_S)

    # -- a dead or hung inference process -------------------------------------------------------

    def _poll_replica(self, replica: Replica) -> None:
        self._poller.register(replica.client.socket, zmq.POLLIN)
        self._replica_by_socket[replica.client.socket] = replica

    def _inference_lost(self, replica: Replica, reason: str, now: float) -> None:
        """End every instance with state in the dead process, forget its exports, start a new one."""
        who = replica.name if len(self.replicas) > 1 else "inference process"
        log.error("the %s is gone: %s", who, reason)
        message = f"{who} died: {reason}"
        for inst in list(replica.instances.values()):
            if replica.holds_state_of(inst):
                self.kill(inst, message)
        old = replica.restart(now)  # InferenceUnavailable past the restart budget
        self.metrics.inference_restarted()
        self._poller.unregister(old.socket)
        del self._replica_by_socket[old.socket]
        old.close()
        self._poll_replica(replica)

    def interception_profile(self, replica: int = 0) -> c.InterceptionProfile:
        """The interception policy's costs now on ``replica``, each marked learnt or default (what `oven
        stats` shows: replica 0's; each replica learns its own)."""
        profiler = self.replicas[replica].profiler
        profile = profiler.profile()
        return c.InterceptionProfile(profile.recompute_b_s, profile.swap_s_per_page, profile.swap_budget_pages,
                                     *profiler.measured, profile.copies_overlap)

    def _log_profile(self, replica: Replica) -> None:
        """Log the interception policy's costs each time one more of them is learnt (a few times a run)."""
        replica.profile_logged = replica.profiler.measured
        log.info("interception profile of %s (%s policy): %s", replica.name, self.config.interception_policy,
                 self.interception_profile(replica.index).describe())

    def close(self) -> None:
        for replica in self.replicas:
            interceptions = replica.interceptions
            log.info("interception costs learnt from the batches of %s: %s; %d contexts swapped out, %d back in "
                     "ahead of their return, %d discarded; %d instances swapped out for the pool", replica.name,
                     self.interception_profile(replica.index).describe(), interceptions.num_swapped_out,
                     interceptions.num_swapped_in, interceptions.num_discarded, replica.allocator.num_preempted)
        for inst in list(self.instances.values()):
            self.kill(inst, "the server is shutting down")
        self.runners.close_all()
        self.http.close()


def _wake_pipe():
    ctx = zmq.Context.instance()
    address = f"inproc://oven-wake-{id(ctx)}-{next(_wake_ids)}"
    reader = ctx.socket(zmq.PULL)
    reader.bind(address)
    writer = ctx.socket(zmq.PUSH)
    writer.connect(address)
    return reader, writer


_wake_ids = itertools.count()
