"""The control loop: one thread that runs inferlet slices, batches their calls and talks to inference.

Each turn of :meth:`ControlLoop.step`:

1. runs one slice of every instance that has a completed future it waits on;
2. asks the dispatch policy whether to form a batch now and, if so, sends the
   scheduler's batch to the inference process (several, under ``eager``);
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

import array
import itertools
import logging
import queue
import re
import sys
import threading
import time
from typing import Callable

import wasmtime
import zmq
from wasmtime import component

from oven.control.config import ControlConfig
from oven.control.inference_client import InferenceClient
from oven.control.resources import ExportRegistry, PhysicalPool, ResourceTable
from oven.control.scheduling import BatchScheduler, Command, DispatchPolicy
from oven.control.supervisor import InferenceSupervisor
from oven.control.tokenizer import Tokenizer
from oven.proto import inference as p
from oven.proto.auth import OPERATOR

from . import host
from .allocator import Allocator
from .futures import DISTS, Future
from .http_client import HttpClient
from .instance import Instance, InstanceLimits, InstanceRecord, State
from .programs import ProgramStore, engine_config
from .queues import QueueState
from .timers import Timers
from .topics import Topics

log = logging.getLogger(__name__)

EPOCH_TICK_S = 0.005
REPLY_CHECK_S = 0.0002  # between two slices, look for inference replies at most this often
START_TIMEOUT_S = 300.0  # a restarted inference process that has not loaded its model by then is killed
_EXIT_STATUS = re.compile(r"^Exited with i32 exit status (\d+)")
EventSink = Callable[[Instance, str, object], None]  # (instance, "stdout"|"stderr"|"message"|"exit", payload)


def make_policy(cfg: ControlConfig) -> DispatchPolicy:
    if cfg.dispatch_policy == "eager":
        return DispatchPolicy.eager()
    if cfg.dispatch_policy == "k":
        return DispatchPolicy.k(cfg.dispatch_k)
    if cfg.dispatch_policy == "t":
        return DispatchPolicy.t(cfg.dispatch_t_ms / 1000.0)
    return DispatchPolicy.adaptive()


class ControlLoop:
    def __init__(self, client: InferenceClient, config: ControlConfig, on_event: EventSink,
                 supervisor: InferenceSupervisor | None = None):
        self.client, self.config, self._on_event = client, config, on_event
        self.supervisor = supervisor
        self.info: p.InfoReply = client.info()
        self._info_request: int | None = None  # a restarted inference process: answers this when it serves
        self._restarted_at = 0.0
        self.tokenizer = Tokenizer(self.info.tokenizer)
        self.engine = wasmtime.Engine(engine_config())
        self.programs = ProgramStore(config.programs_path, self.engine)
        self.linker = component.Linker(self.engine)
        self.linker.add_wasip2()
        self.wasm_clock = host.WasmClock()
        host.define_imports(self.linker, lambda: self.current, self.wasm_clock)
        self.current: Instance | None = None
        self.scheduler = BatchScheduler()
        self.policy = make_policy(config)
        self.kv_pool = PhysicalPool("kvpage", self.info.num_kv_pages)
        self.embed_pool = PhysicalPool("embed", self.info.num_embeds)
        self.host_pool = PhysicalPool("host slot", self.info.num_host_pages)
        self.exports = ExportRegistry(self.kv_pool)
        self.allocator = Allocator(self)
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
        self.instances: dict[str, Instance] = {}
        self.finished: dict[str, InstanceRecord] = {}  # what `ps` shows of ended instances
        self._commands: dict[int, tuple[Instance, Future]] = {}
        self._in_flight: dict[int, tuple[object, float]] = {}  # request id -> (Batch, when sent)
        self._ids = itertools.count(1)
        self._limits = InstanceLimits(config.instance_memory_mib << 20, config.slice_ms,
                                      config.max_kv_pages_per_instance, config.max_embeds_per_instance,
                                      config.inbox_messages, config.inbox_mib << 20)
        self._ticker = threading.Thread(target=self._tick_epochs, daemon=True, name="oven-epoch")
        self._stopping = False
        self._ticker.start()

    # -- lifecycle of instances ---------------------------------------------

    def launch(self, program: str, args: list[str], owner: str = OPERATOR) -> Instance:
        """Instantiate a stored program for client ``owner`` (it names it, or uploaded it); raises
        ProgramError / wasmtime errors for a bad one."""
        if len(self.instances) >= self.config.max_instances:
            raise RuntimeError(f"the server runs its maximum of {self.config.max_instances} instances")
        digest = self.programs.resolve(program, owner)
        instance_id = f"{next(self._ids):x}-{digest[:8]}"
        inst = Instance(instance_id, digest, list(args), owner, self, self._limits, self.engine, self.linker,
                        self.programs.component(digest), 1 / (1000 * EPOCH_TICK_S), self.wasm_clock)
        inst.started_at = time.monotonic()
        inst.resources = ResourceTable(instance_id, self.kv_pool, self.embed_pool, self.host_pool,
                                       max_kvpages=self._limits.max_kv_pages, max_embeds=self._limits.max_embeds)
        inst.queues[0] = QueueState(self.scheduler.create_queue(_numeric(instance_id)))
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
        for command in self.scheduler.remove_instance(_numeric(inst.instance_id)):
            _, fut = self._commands.pop(command.command_id)
            inst.futures.fail(fut, "the instance ended")
        self.allocator.forget(inst)
        self.http.forget(inst.instance_id)
        if inst.state is not State.FINISHED:  # its KV may be half written: no one should import it
            for export in self.exports.exported_by(inst.instance_id):
                self.exports.drop(export.name, export.namespace)
        inst.resources.release_all()
        inst.release_store()
        self.topics.forget(inst.instance_id)
        self.instances.pop(inst.instance_id, None)
        self.finished[inst.instance_id] = inst.record()
        while len(self.finished) > self.config.finished_instances:  # oldest first (dicts keep insertion order)
            del self.finished[next(iter(self.finished))]
        self.emit(inst, "exit", inst.exit_code)
        self.allocator.retry_parked()

    # -- calls from host functions -------------------------------------------

    def emit(self, inst: Instance, kind: str, payload: object) -> None:
        if kind == "stderr":
            inst.stderr_tail += str(payload)
            inst.stderr_tail = inst.stderr_tail[-4096:]
        self._on_event(inst, kind, payload)

    def submit(self, inst: Instance, q: int, call_type: str, item, fut: Future, num_tokens: int,
               writes: frozenset, reads: frozenset, kv_context: tuple | None = None) -> None:
        state = inst.queue(q)
        command = Command(command_id=next(self._ids), queue_id=state.scheduler_queue_id, call_type=call_type,
                          item=item, enqueued_at=time.monotonic(), num_tokens=max(1, num_tokens),
                          reads=reads, writes=writes, kv_context=kv_context)
        self._commands[command.command_id] = (inst, fut)
        state.track(fut)
        self.scheduler.submit(command)

    def create_queue(self, inst: Instance, priority: int) -> int:
        q = max(inst.queues) + 1
        inst.queues[q] = QueueState(self.scheduler.create_queue(_numeric(inst.instance_id), priority))
        return q

    def destroy_queue(self, inst: Instance, q: int) -> None:
        if q == 0:
            raise ValueError("queue 0 cannot be destroyed")
        state = inst.queues.pop(q, None)
        if state is None:
            raise ValueError(f"queue {q} does not exist in this inferlet")
        for command in self.scheduler.remove_queue(state.scheduler_queue_id):
            _, fut = self._commands.pop(command.command_id)
            inst.futures.fail(fut, "its queue was destroyed")

    def set_queue_priority(self, inst: Instance, q: int, priority: int) -> None:
        self.scheduler.set_priority(inst.queue(q).scheduler_queue_id, priority)

    def drop_export(self, name: str, by: Instance | None = None, namespace: str = OPERATOR) -> None:
        """Release an export: for its exporter ``by`` (``release-export``), or for a client of the
        server, in ``namespace``.

        Raises ResourceError for an unknown name, or one ``by`` did not export.
        """
        freed = (self.exports.unexport(name, by.instance_id, by.owner) if by
                 else self.exports.drop(name, namespace))
        if freed:  # a parked allocation may fit now
            self.allocator.retry_parked()

    def post(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` on the loop thread (safe to call from any thread)."""
        self._posted.put(callback)
        self._wake_w.send(b"")

    # -- the loop --------------------------------------------------------------

    def step(self, timeout_s: float, extra: dict | None = None) -> None:
        """One turn; ``extra`` maps more zmq sockets to handlers called when they are readable."""
        self._run_ready_instances()
        self._dispatch()
        if self.supervisor is not None:
            self._watch_inference(time.monotonic())
        extra = extra or {}
        if self._extra_polled != extra.keys():  # the caller's sockets changed (say, a server closed its own)
            for sock in self._extra_polled - extra.keys():
                self._poller.unregister(sock)
            for sock in extra.keys() - self._extra_polled:
                self._poller.register(sock, zmq.POLLIN)
            self._extra_polled = set(extra)
        busy = any(i.state is State.READY and not (i.swapping or i.output_held) for i in self.instances.values())
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
        if (wake := self.policy.next_wakeup(now, self.scheduler.oldest_enqueued_at)) is not None:
            candidates.append(wake - now)
        return max(0.0, min(candidates))

    def _run_ready_instances(self) -> None:
        next_reply_check = 0.0
        for inst in [i for i in self.instances.values() if i.state is State.READY and not i.output_held]:
            if inst.swapped_out:
                self.allocator.restore_before_slice(inst)
            if inst.swapping or not inst.alive:
                continue
            self.current = inst
            try:
                inst.run_slice()
            except (wasmtime.Trap, wasmtime.WasmtimeError, ValueError) as exc:
                self.kill(inst, *_failure(exc, inst), state=State.FAILED)
            finally:
                self.current = None
            if inst.state is State.FINISHED:
                self._retire(inst)
            # Keep the device busy while the other slices run (xLLM-style overlap): the
            # policy decides, so `adaptive` sends the moment the inference layer is idle.
            # A look costs a few us; every 0.2 ms is soon enough for a device step of milliseconds.
            if self._in_flight and (now := time.monotonic()) >= next_reply_check:
                self._drain_replies()
                next_reply_check = now + REPLY_CHECK_S
            self._dispatch()

    def _dispatch(self) -> None:
        if self._info_request is not None:  # a new inference process is still loading
            return
        while True:
            now = time.monotonic()
            if not self.policy.should_dispatch(now, self.scheduler.num_pending, self.scheduler.oldest_enqueued_at,
                                               not self._in_flight, len(self._in_flight)):
                return
            batch = self.scheduler.form_batch(now, self.info.max_batch_items, self.info.max_batch_tokens)
            if batch is None:
                return
            self._in_flight[self.client.send(batch.to_request())] = (batch, now)

    def _drain_replies(self) -> None:
        while (message := self.client.try_recv()) is not None:
            request_id, reply = message
            if request_id == self._info_request:
                self._inference_back(reply)
                continue
            batch, _ = self._in_flight.pop(request_id, (None, 0.0))
            if batch is not None:
                self._complete(batch, reply)

    # -- a dead or hung inference process -------------------------------------------------------

    def _watch_inference(self, now: float) -> None:
        if self._info_request is not None:
            if now - self._restarted_at > max(self.config.inference_timeout_s, START_TIMEOUT_S):
                self.supervisor.kill(f"the new inference process did not serve within {START_TIMEOUT_S:.0f} s")
        elif self._in_flight:
            _, oldest = next(iter(self._in_flight.values()))  # dicts keep the order batches were sent
            if now - oldest > self.config.inference_timeout_s:
                self.supervisor.kill(f"no reply to a batch in {self.config.inference_timeout_s:.0f} s (hung; "
                                     "oven serve --inference-timeout-s)")
        reason = self.supervisor.check(now)
        if reason is not None:
            self._inference_lost(reason, now)

    def _inference_lost(self, reason: str, now: float) -> None:
        """End every instance with state in the dead process, forget its exports, start a new one."""
        log.error("the inference process is gone: %s", reason)
        message = f"inference process died: {reason}"
        in_flight = {command.command_id for batch, _ in self._in_flight.values() for command in batch.commands}
        self._in_flight.clear()
        for inst in list(self.instances.values()):
            table = inst.resources
            if (table.num_kvpages or table.num_embeds or inst.swapping
                    or any(owner is inst for owner, _ in self._commands.values())):
                self.kill(inst, message)
        for command_id in in_flight:  # every one belongs to an instance killed above: forget them
            self._commands.pop(command_id, None)
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
            log.warning("the new inference process serves; dispatching again")
            return
        self.supervisor.kill(f"the new inference process does not match the old one: {reply}")

    def _complete(self, batch, reply) -> None:
        for i, command in enumerate(batch.commands):
            inst, fut = self._commands.pop(command.command_id, (None, None))
            if inst is None:
                continue
            try:
                self._settle(inst, fut, reply, i)
            except Exception as exc:  # a bookkeeping bug hits one instance, never the loop
                log.exception("completing a %s call of %s failed", command.call_type, inst.instance_id)
                self.kill(inst, f"internal error: {type(exc).__name__}: {exc}")

    @staticmethod
    def _settle(inst: Instance, fut: Future, reply, i: int) -> None:
        """Complete item ``i``'s future from a batch reply."""
        if isinstance(reply, p.ErrorReply):
            inst.futures.fail(fut, f"{reply.code}: {reply.message}")
        elif reply.errors[i] is not None:
            inst.futures.fail(fut, f"{reply.errors[i].code}: {reply.errors[i].message}")
        elif fut.kind == DISTS:
            dists = reply.dists[i] if isinstance(reply.dists[i], list) else [reply.dists[i]]
            inst.futures.complete(fut, [_decode_dist(d) for d in dists])
        else:
            inst.futures.complete(fut)

    def _tick_epochs(self) -> None:
        while not self._stopping:
            time.sleep(EPOCH_TICK_S)
            self.engine.increment_epoch()

    def close(self) -> None:
        self._stopping = True
        for inst in list(self.instances.values()):
            self.kill(inst, "the server is shutting down")
        self.http.close()


def _decode_dist(dist: p.TopKDist) -> tuple[list[int], list[float]]:
    """Little-endian int32 ids and float32 probabilities (see proto/inference.py) as Python lists."""
    ids, probs = array.array("i", dist.token_ids), array.array("f", dist.probs)
    if sys.byteorder == "big":
        ids.byteswap()
        probs.byteswap()
    return ids.tolist(), probs.tolist()


def _numeric(instance_id: str) -> int:
    return int(instance_id.split("-", 1)[0], 16)


def _trap_message(exc: Exception) -> str:
    """The cause of a trap ("wasm trap: interrupt"), not the backtrace wasmtime puts first."""
    text = str(exc).strip()
    if "Caused by:" in text:
        return " ".join(text.rsplit("Caused by:", 1)[1].split())
    return text.splitlines()[0] if text else type(exc).__name__


def _failure(exc: Exception, inst: Instance) -> tuple[str, int]:
    """Why a failed slice ends ``inst`` (the trap's cause, and which limit it hit if it hit one), and its status."""
    reason, status = _trap_message(exc), 1
    last_words = inst.last_stderr_line()  # a guest's own error text beats "unreachable"
    if (exited := _EXIT_STATUS.match(reason)) is not None:  # the guest exited (the Python SDK, on an exception)
        reason, last_words, status = last_words or f"exited with status {exited[1]}", "", int(exited[1])
    elif reason == "wasm trap: interrupt":  # the epoch deadline (Instance.run_slice)
        return (f"{reason}: one slice ran past the {inst.limits.slice_ms} ms deadline without waiting on a "
                "future (oven serve --slice-ms)", status)
    if "MemoryError" in inst.stderr_tail:  # CPython's answer when memory.grow hits the store's limit
        reason += (f": out of memory, the instance's limit is {inst.limits.memory_bytes >> 20} MiB "
                   "(oven serve --instance-memory-mib)")
    return reason + (f" ({last_words})" if last_words else ""), status


def _wake_pipe():
    ctx = zmq.Context.instance()
    address = f"inproc://oven-wake-{id(ctx)}-{next(_wake_ids)}"
    reader = ctx.socket(zmq.PULL)
    reader.bind(address)
    writer = ctx.socket(zmq.PUSH)
    writer.connect(address)
    return reader, writer


_wake_ids = itertools.count()
