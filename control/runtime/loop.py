"""The control loop: one thread that runs inferlet slices, batches their calls and talks to inference.

Each turn of :meth:`ControlLoop.step`:

1. runs one slice of every instance that has a completed future it waits on;
2. asks the dispatch policy whether to form a batch now and, if so, sends the
   scheduler's batch to the inference process (several, under ``eager``);
   then lets the interception policy swap intercepted instances' pages out or
   back in, or discard them (runtime/interceptions.py), and, if instances wait for memory while
   the device is idle, has the allocator decide for them again;
3. completes futures from the replies that arrived, fires due timers and runs
   callbacks posted from other threads (HTTP);
4. blocks in ``zmq.Poller`` until a reply, a client request or a deadline.

The inference process answers in FIFO order, which is what makes it safe to
free memory as soon as the calls that used it have been *sent*: anything that
reuses it is sent later and so runs later.

With a supervisor (``oven serve``), a dead or hung inference process is noticed
within a turn or two: every instance that had state in it (pages, embeds, calls
queued or in flight) ends with ``inference process died: ...``, the exports go,
and a new process starts; the loop dispatches again once it answers.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from typing import Callable

import wasmtime
import zmq
from wasmtime import component

from oven.control.adapter_store import AdapterStore
from oven.control.config import ControlConfig
from oven.control.inference_client import InferenceClient
from oven.control.resources import ExportRegistry, PhysicalPool, ResourceTable
from oven.control.scheduling import BatchScheduler
from oven.control.scheduling.profiler import CostProfiler
from oven.control.supervisor import InferenceSupervisor
from oven.control.tokenizer import Tokenizer
from oven.proto import control as c
from oven.proto import inference as p
from oven.proto.auth import OPERATOR

from . import host
from .adapters import Adapters
from .allocator import Allocator
from .calls import InferenceCalls
from .http_client import HttpClient
from .instance import Instance, InstanceLimits, InstanceRecord, State
from .interceptions import Interceptions
from .programs import ProgramStore, engine_config
from .services import EventSink, HostServices
from .snapshot import LoopSnapshot
from .timers import Timers
from .topics import Topics

log = logging.getLogger(__name__)

EPOCH_TICK_S = 0.005
REPLY_CHECK_S = 0.0002  # between two slices, look for inference replies at most this often
START_TIMEOUT_S = 300.0  # a restarted inference process that has not loaded its model by then is killed


class ControlLoop:
    """Owns every part of the control process but the client RPC, and drives them from one thread.

    The server reads it through :meth:`snapshot`, :meth:`record` and :meth:`num_instances`, and
    changes it only through :meth:`launch`, :meth:`terminate`, :meth:`deliver`,
    :meth:`hold_output`, :meth:`drop_export` and :attr:`adapters` (the LoRA adapters by name);
    host functions see :class:`HostServices`.
    """

    def __init__(self, client: InferenceClient, config: ControlConfig, on_event: EventSink,
                 supervisor: InferenceSupervisor | None = None):
        self.client, self.config, self._on_event = client, config, on_event
        self.supervisor = supervisor
        self.info: p.InfoReply = client.info()
        self._info_request: int | None = None  # a restarted inference process: answers this when it serves
        self._restarted_at = 0.0
        # Ids are the control process's (see adapters.py): every adapter is loaded before any batch is sent.
        self.adapters = Adapters(AdapterStore(config.adapters_path), lambda request: self.client.send(request),
                                 self.info)
        self.adapters.load_stored(lambda request_id: self.client.wait_reply(request_id, START_TIMEOUT_S))
        self.engine = wasmtime.Engine(engine_config())
        self.programs = ProgramStore(config.programs_path, self.engine)
        self.linker = component.Linker(self.engine)
        self.linker.add_wasip2()
        self.wasm_clock = host.WasmClock()
        host.define_imports(self.linker, lambda: self.current, self.wasm_clock)
        self.current: Instance | None = None
        self.instances: dict[str, Instance] = {}
        self.finished: dict[str, InstanceRecord] = {}  # what `ps` shows of ended instances
        self.scheduler = BatchScheduler()
        # The host tier copies on a side stream on CUDA only (inference/memory.py); elsewhere between steps.
        self.profiler = CostProfiler(copies_overlap=self.info.device.startswith("cuda"))
        self._profile_logged = self.profiler.measured  # what _log_profile last reported
        # Interceptions is built below, once the pools and the allocator are: it hears of every batch.
        self.calls = InferenceCalls(self.scheduler, on_broken=self.kill,
                                    on_batch=lambda *batch: self.interceptions.observe_batch(*batch))
        self.kv_pool = PhysicalPool("kvpage", self.info.num_kv_pages)
        self.embed_pool = PhysicalPool("embed", self.info.num_embeds)
        self.host_pool = PhysicalPool("host slot", self.info.num_host_pages)
        self.exports = ExportRegistry(self.kv_pool)
        self.allocator = Allocator(config.exhaustion, kv_pool=self.kv_pool, host_pool=self.host_pool,
                                   exports=self.exports, page_size=self.info.page_size, submit=self.calls.submit,
                                   instances=self.instances, kill=self.kill, has_calls=self.calls.has_calls)
        self.interceptions = Interceptions(config.interception, self.profiler, allocator=self.allocator,
                                           kv_pool=self.kv_pool, host_pool=self.host_pool,
                                           page_size=self.info.page_size, has_calls=self.calls.has_calls)
        self.timers, self.topics = Timers(), Topics()
        self._posted: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._wake_r, self._wake_w = _wake_pipe()
        self._poller = zmq.Poller()  # built once: every turn of the loop polls it
        for sock in (client.socket, self._wake_r):
            self._poller.register(sock, zmq.POLLIN)
        self._extra_polled: set[zmq.Socket] = set()  # the sockets of step()'s last ``extra``
        self.http = HttpClient(config.http_allow_list, post=self.post, timeout_s=config.http_timeout_s,
                               per_instance=config.http_fetches_per_instance,
                               queue_per_instance=config.http_queue_per_instance, workers=config.http_workers,
                               max_body_bytes=config.http_max_body_mib << 20)
        self._host = HostServices(info=self.info, tokenizer=Tokenizer(self.info.tokenizer), calls=self.calls,
                                  allocator=self.allocator, adapters=self.adapters, exports=self.exports,
                                  topics=self.topics, timers=self.timers, http=self.http, emit=on_event)
        self._instance_numbers = itertools.count(1)
        self._limits = InstanceLimits(config.instance_memory_mib << 20, config.slice_ms,
                                      config.max_kv_pages_per_instance, config.max_embeds_per_instance,
                                      config.inbox_messages, config.inbox_mib << 20)
        self._ticker = threading.Thread(target=self._tick_epochs, daemon=True, name="oven-epoch")
        self._stopping = False
        self._ticker.start()

    # -- lifecycle of instances ---------------------------------------------

    def launch(self, program: str, args: list[str], owner: str = OPERATOR) -> Instance:
        """Instantiate a stored program for client ``owner`` (it names it, or uploaded it); raises
        ProgramError / wasmtime errors for a bad one, RuntimeError past ``max_instances``."""
        if len(self.instances) >= self.config.max_instances:
            raise RuntimeError(f"the server runs its maximum of {self.config.max_instances} instances")
        digest = self.programs.resolve(program, owner)
        sequence = next(self._instance_numbers)
        instance_id = f"{sequence:x}-{digest[:8]}"
        inst = Instance(instance_id, digest, list(args), owner, self._host, self._limits, self.engine, self.linker,
                        self.programs.component(digest), 1 / (1000 * EPOCH_TICK_S), self.wasm_clock)
        inst.started_at, inst.sequence = time.monotonic(), sequence
        inst.resources = ResourceTable(instance_id, self.kv_pool, self.embed_pool, self.host_pool,
                                       max_kvpages=self._limits.max_kv_pages, max_embeds=self._limits.max_embeds)
        self.calls.open_queue(inst)  # queue 0
        self.instances[instance_id] = inst
        return inst

    def kill(self, inst: Instance, reason: str, exit_code: int = 1, state: State = State.KILLED) -> None:
        """End ``inst`` for ``reason``: ``State.KILLED`` from outside, ``State.FAILED`` for its own fault."""
        if not inst.alive:
            return
        inst.state, inst.error, inst.exit_code = state, reason, exit_code
        self._retire(inst)

    def _retire(self, inst: Instance) -> None:
        """Return everything the instance holds; fail what it still had queued."""
        self.calls.drop_instance(inst)
        self.allocator.forget(inst)
        self.http.forget(inst.instance_id)
        if inst.state is not State.FINISHED:  # its KV may be half written: no one should import it
            for export in self.exports.exported_by(inst.instance_id):
                self.exports.drop(export.name, export.namespace)
        inst.resources.release_all()
        inst.release_store()
        self.topics.forget(inst.instance_id)
        self.timers.forget(inst.instance_id)
        self.instances.pop(inst.instance_id, None)
        self.finished[inst.instance_id] = inst.record()
        while len(self.finished) > self.config.finished_instances:  # oldest first (dicts keep insertion order)
            del self.finished[next(iter(self.finished))]
        self._on_event(inst, "exit", inst.exit_code)
        self.allocator.retry_parked()

    # -- what the server reads and changes ----------------------------------------------

    def snapshot(self) -> LoopSnapshot:
        return LoopSnapshot(tuple(inst.record() for inst in self.instances.values()), tuple(self.finished.values()),
                            tuple(self.exports.exports()), self.scheduler.stats(), self.kv_pool.num_free,
                            self.embed_pool.num_free, self.host_pool.num_free, self.interceptions.num_swapped_out,
                            self.interceptions.num_swapped_in, self.interceptions.num_discarded,
                            self.config.interception_policy, self.interception_profile(),
                            self.calls.device_s, self.calls.rewrite_s, self.interceptions.intercepted_page_s,
                            self.interceptions.contended_page_s, self.allocator.num_preempted,
                            self.calls.rewrite_page_s, self.interceptions.copy_s, self.interceptions.copy_page_s)

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
        self.allocator.drop_export(name, namespace=namespace)

    def post(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` on the loop thread (safe to call from any thread)."""
        self._posted.put(callback)
        self._wake_w.send(b"")

    # -- the loop --------------------------------------------------------------

    def step(self, timeout_s: float, extra: dict | None = None) -> None:
        """One turn; ``extra`` maps more zmq sockets to handlers called when they are readable."""
        self._run_ready_instances()
        self._dispatch()
        self.interceptions.step(self.instances.values(), time.monotonic())
        self._dispatch()  # the copies it chose
        if self.profiler.measured != self._profile_logged:
            self._log_profile()
        if self.supervisor is not None:
            self._watch_inference(time.monotonic())
        extra = extra or {}
        if self._extra_polled != extra.keys():  # the caller's sockets changed (say, a server closed its own)
            for sock in self._extra_polled - extra.keys():
                self._poller.unregister(sock)
            for sock in extra.keys() - self._extra_polled:
                self._poller.register(sock, zmq.POLLIN)
            self._extra_polled = set(extra)
        if self.allocator.num_waiting and not self.calls.num_in_flight and not self.scheduler.num_pending:
            # The device is idle while instances wait for memory: decide again, now that the
            # instances that were running have stopped (they may be swapped out for the oldest).
            self.allocator.retry_parked()
        busy = any(self._runnable(i) for i in self.instances.values())
        wait_s = 0.0 if busy else self._time_to_next_event(timeout_s)
        for sock, _ in self._poller.poll(int(wait_s * 1000)):
            if sock is self.client.socket:
                self._drain_replies()
            elif sock is self._wake_r:
                while self._wake_r.poll(0):
                    self._wake_r.recv()
            else:
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
        if (wake := self.config.dispatch.next_wakeup(now, self.scheduler.oldest_enqueued_at)) is not None:
            candidates.append(wake - now)
        return max(0.0, min(candidates))

    def _runnable(self, inst: Instance) -> bool:
        """Has a slice to run now: not held for its client, not swapped out and waiting for its pages,
        and, for an instance not started yet, admitted (no one waits for memory under FCFS)."""
        return (inst.state is State.READY and not (inst.output_held or inst.swapping)
                and not (inst.swapped_out and self.allocator.is_waiting(inst))
                and (inst.started or self.allocator.admitting))

    def _run_ready_instances(self) -> None:
        next_reply_check = 0.0
        ready = [i for i in self.instances.values() if i.state is State.READY and not i.output_held]
        for position, inst in enumerate(ready):
            if not self._runnable(inst):  # admission is decided per instance: a slice may make someone wait
                continue
            if inst.swapped_out:
                self.allocator.swap_in(inst)  # it runs once its pages are back
            if inst.swapping or inst.swapped_out or not inst.alive:
                continue
            self.current = inst
            try:
                inst.run_slice()
            except (wasmtime.Trap, wasmtime.WasmtimeError, ValueError) as exc:
                self.kill(inst, *inst.failure(exc), state=State.FAILED)
            finally:
                self.current = None
            if inst.state is State.FINISHED:
                self._retire(inst)
            # Keep the device busy while the other slices run (xLLM-style overlap): the
            # policy decides, knowing how many instances of this pass are still to run.
            # A look costs a few us; every 0.2 ms is soon enough for a device step of milliseconds.
            if self.calls.num_in_flight and (now := time.monotonic()) >= next_reply_check:
                self._drain_replies()
                next_reply_check = now + REPLY_CHECK_S
            self._dispatch(instances_to_run=len(ready) - position - 1)

    def _dispatch(self, instances_to_run: int = 0) -> None:
        if self._info_request is not None:  # a new inference process is still loading
            return
        policy, scheduler, calls = self.config.dispatch, self.scheduler, self.calls
        while True:
            now = time.monotonic()
            in_flight = calls.num_in_flight
            if not policy.should_dispatch(now, scheduler.num_pending, scheduler.oldest_enqueued_at, not in_flight,
                                          in_flight, instances_to_run, scheduler.num_pending_chained):
                return
            batch = scheduler.form_batch(now, self.info.max_batch_items, self.info.max_batch_tokens)
            if batch is None:
                return
            calls.sent(self.client.send(batch.to_request()), batch, now)

    def _drain_replies(self) -> None:
        while (message := self.client.try_recv()) is not None:
            request_id, reply = message
            if request_id == self._info_request:
                self._inference_back(reply)
            elif not self.adapters.settle(request_id, reply):
                self.calls.settle(request_id, reply)

    # -- a dead or hung inference process -------------------------------------------------------

    def _watch_inference(self, now: float) -> None:
        oldest = self.calls.oldest_sent_at
        if self._info_request is not None:
            if now - self._restarted_at > max(self.config.inference_timeout_s, START_TIMEOUT_S):
                self.supervisor.kill(f"the new inference process did not serve within {START_TIMEOUT_S:.0f} s")
        elif oldest is not None and now - oldest > self.config.inference_timeout_s:
            self.supervisor.kill(f"no reply to a batch in {self.config.inference_timeout_s:.0f} s (hung; "
                                 "oven serve --inference-timeout-s)")
        reason = self.supervisor.check(now)
        if reason is not None:
            self._inference_lost(reason, now)

    def _inference_lost(self, reason: str, now: float) -> None:
        """End every instance with state in the dead process, forget its exports, start a new one."""
        log.error("the inference process is gone: %s", reason)
        message = f"inference process died: {reason}"
        for inst in list(self.instances.values()):
            table = inst.resources
            if table.num_kvpages or table.num_embeds or inst.swapping or self.calls.has_calls(inst):
                self.kill(inst, message)
        self.calls.forget_in_flight()  # every one belonged to an instance killed above
        for export in self.exports.exports():  # their pages were in the dead process
            self.exports.drop(export.name, export.namespace)
        self._poller.unregister(self.client.socket)
        self.client.close()
        self.client = self.supervisor.restart(now)  # InferenceUnavailable past the restart budget
        self._poller.register(self.client.socket, zmq.POLLIN)
        self._info_request = self.client.send(p.InfoRequest())
        self._restarted_at = now

    def _inference_back(self, reply) -> None:
        self._info_request = None
        same = ("model_name", "page_size", "num_kv_pages", "num_embeds", "num_host_pages")
        if isinstance(reply, p.InfoReply) and all(getattr(reply, f) == getattr(self.info, f) for f in same):
            self.adapters.reload()  # sent before any batch: the process answers in order
            log.warning("the new inference process serves; dispatching again")
            return
        self.supervisor.kill(f"the new inference process does not match the old one: {reply}")

    def interception_profile(self) -> c.InterceptionProfile:
        """The interception policy's costs now, each marked learnt or default (what `oven stats` shows)."""
        profile = self.profiler.profile()
        return c.InterceptionProfile(profile.recompute_b_s, profile.swap_s_per_page, profile.swap_budget_pages,
                                     *self.profiler.measured, profile.copies_overlap)

    def _log_profile(self) -> None:
        """Log the interception policy's costs each time one more of them is learnt (a few times a run)."""
        self._profile_logged = self.profiler.measured
        log.info("interception profile (%s policy): %s", self.config.interception_policy,
                 self.interception_profile().describe())

    def _tick_epochs(self) -> None:
        while not self._stopping:
            time.sleep(EPOCH_TICK_S)
            self.engine.increment_epoch()

    def close(self) -> None:
        self._stopping = True
        log.info("interception costs learnt from this run's batches: %s; %d contexts swapped out, %d back in "
                 "ahead of their return, %d discarded; %d instances swapped out for the pool",
                 self.interception_profile().describe(),
                 self.interceptions.num_swapped_out, self.interceptions.num_swapped_in,
                 self.interceptions.num_discarded, self.allocator.num_preempted)
        for inst in list(self.instances.values()):
            self.kill(inst, "the server is shutting down")
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
