"""One inference process as the control loop keeps it: a replica of the model with memory of its own.

``oven serve --data-parallel N`` runs N inference processes. Each has its own KvPage, embed and
host pools, so everything that names a physical page or slot is kept per replica, here: the pools
themselves, the exports over them, the allocator and the interception policy that decide over
them, the command queues and the batches formed from them (one batch per replica per turn, each
with its own pipelined decode: the replies of one process settle only its calls), and the cost
profile learnt from its batches. An instance lives on one replica (``placement.py``) and reaches it
through :attr:`Replica.host`; what is not per process (programs, runners, adapters by name, topics,
timers, http) stays with the loop.

With a supervisor, :meth:`Replica.watch` notices a dead or hung process; the loop ends the instances
that had state in it and calls :meth:`Replica.restart`. The others keep serving meanwhile.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from oven.control.config import ControlConfig
from oven.control.inference_client import InferenceClient
from oven.control.resources.exports import ExportRegistry, SnapshotLimits
from oven.control.resources.pool import PhysicalPool
from oven.control.scheduling.batcher import BatchScheduler
from oven.control.scheduling.chunks import chunk_budget
from oven.control.scheduling.profiler import CostProfiler
from oven.control.remote import RemoteInference
from oven.control.supervisor import InferenceSupervisor
from oven.proto import inference as p

from .adapters import Adapters
from .allocator import Allocator
from .calls import InferenceCalls
from .instance import Instance
from .interceptions import Interceptions
from .services import HostServices

log = logging.getLogger(__name__)

START_TIMEOUT_S = 300.0  # an inference process that has not loaded its model (and adapters) by then is killed
Supervisor = InferenceSupervisor | RemoteInference  # what notices a replica's loss and starts (or awaits) another


class Replica:
    """The control side of inference process ``index``: its client, pools, queues and policies.

    ``info`` is what the process answered at start; ``services`` completes the replica's
    :class:`HostServices` with what every replica shares; ``kill(inst, reason)`` ends an instance
    (the allocator's and the calls' last resort).
    """

    def __init__(self, index: int, client: InferenceClient, info: p.InfoReply, config: ControlConfig,
                 adapters: Adapters, kill: Callable[[Instance, str], None], services: dict,
                 supervisor: Supervisor | None = None):
        self.index, self.client, self.info, self.config, self.supervisor = index, client, info, config, supervisor
        self.name = f"inference replica {index}"
        self.instances: dict[str, Instance] = {}  # those that live here, in launch order
        self._info_request: int | None = None  # a restarted process answers this once it serves
        self._restarted_at = 0.0
        self.scheduler = BatchScheduler()
        self.wave_held_since: float | None = None  # since when the wave holds back a batch (dispatch)
        # The host tier copies on a side stream on CUDA only (inference/memory.py); elsewhere between steps.
        self.profiler = CostProfiler(copies_overlap=self.info.device.startswith("cuda"))
        self.profile_logged = self.profiler.measured  # what the loop last logged of it
        # Chunked prefill: a longer forward goes as chunks, and batches stay small enough that a decode
        # step never waits for a whole long prompt's forward, however large the process would take them.
        chunk, self.batch_tokens = chunk_budget(config.prefill_chunk_tokens, info.device, info.max_batch_tokens)
        # Interceptions is built below, once the pools and the allocator are: it hears of every batch.
        self.calls = InferenceCalls(self.scheduler, on_broken=kill,
                                    on_batch=lambda *batch: self.interceptions.observe_batch(*batch),
                                    chunk_tokens=chunk, page_size=info.page_size)
        self.kv_pool = PhysicalPool("kvpage", self.info.num_kv_pages)
        self.embed_pool = PhysicalPool("embed", self.info.num_embeds)
        self.host_pool = PhysicalPool("host slot", self.info.num_host_pages)
        self.exports = ExportRegistry(self.kv_pool, self.info.page_size, SnapshotLimits(
            config.max_snapshots_per_client, config.max_snapshot_pages_per_client))
        self.allocator = Allocator(config.exhaustion, kv_pool=self.kv_pool, host_pool=self.host_pool,
                                   exports=self.exports, page_size=self.info.page_size, submit=self.calls.submit,
                                   instances=self.instances, kill=kill,
                                   has_calls=lambda inst: inst.in_slice or self.calls.has_calls(inst))
        self.interceptions = Interceptions(config.interception, self.profiler, allocator=self.allocator,
                                           kv_pool=self.kv_pool, host_pool=self.host_pool,
                                           page_size=self.info.page_size, has_calls=self.calls.has_calls)
        self.host = HostServices(info=self.info, calls=self.calls, allocator=self.allocator, adapters=adapters,
                                 exports=self.exports, **services)

    @property
    def serving(self) -> bool:
        """False while a restarted process loads its model (no batch is sent to it meanwhile)."""
        return self._info_request is None

    @property
    def load(self) -> tuple[int, int]:
        """What placement compares: KvPages in use, then instances living here."""
        return self.kv_pool.num_used, len(self.instances)

    def holds_state_of(self, inst: Instance) -> bool:
        """Whether ``inst`` has anything in this process: pages, embeds, a copy under way, or calls."""
        table = inst.resources
        return bool(table.num_kvpages or table.num_embeds or inst.swapping or self.calls.has_calls(inst))

    # -- batches ---------------------------------------------------------------------------------

    def dispatch(self, instances_to_run: int, now: Callable[[], float], max_wave_wait_s: float) -> None:
        """Send the batches the dispatch policy asks for now; ``instances_to_run``: slices of this
        replica's instances that may still add a call (the loop's wave), which hold back a batch the
        policy would otherwise send for ``max_wave_wait_s`` at most (:attr:`wave_held_since`)."""
        if not self.serving:
            self.wave_held_since = None
            return
        policy, scheduler, calls = self.config.dispatch, self.scheduler, self.calls
        while True:
            t = now()
            in_flight = calls.num_in_flight
            state = (t, scheduler.num_pending, scheduler.oldest_enqueued_at, not in_flight, in_flight)
            if not policy.should_dispatch(*state, 0, scheduler.num_pending_chained):
                self.wave_held_since = None
                return
            if instances_to_run and not policy.should_dispatch(*state, instances_to_run, scheduler.num_pending_chained):
                if self.wave_held_since is None:
                    self.wave_held_since = t
                if t - self.wave_held_since < max_wave_wait_s:
                    return
            self.wave_held_since = None
            if drops := calls.decoder_ids.take_drops():  # after every item naming them (their commands settled)
                self.client.send(p.DropDecodersRequest(drops))
            batch = scheduler.form_batch(t, self.info.max_batch_items, self.batch_tokens)
            if batch is None:
                return
            calls.sent(self.client.send(batch.to_request()), batch, t)

    def drain_replies(self, adapters: Adapters) -> None:
        while (message := self.client.try_recv()) is not None:
            request_id, reply = message
            if request_id == self._info_request:
                self._back(reply, adapters)
            elif not adapters.settle(self.index, request_id, reply):
                self.calls.settle(request_id, reply)

    # -- a dead or hung process ------------------------------------------------------------------

    def watch(self, now: float) -> str | None:
        """Why this replica's process is gone (killing it first if it hangs), or None while it serves."""
        oldest = self.calls.oldest_sent_at
        if self._info_request is not None:
            if now - self._restarted_at > max(self.config.inference_timeout_s, START_TIMEOUT_S):
                self.supervisor.kill(f"the new inference process did not serve within {START_TIMEOUT_S:.0f} s")
        elif oldest is not None and now - oldest > self.config.inference_timeout_s:
            self.supervisor.kill(f"no reply to a batch in {self.config.inference_timeout_s:.0f} s (hung; "
                                 "oven serve --inference-timeout-s)")
        return self.supervisor.check(now)

    def restart(self, now: float) -> InferenceClient:
        """Forget what was in the dead process and start another; the old client is returned for the loop
        to stop polling and close. The caller has ended every instance with state here."""
        self.calls.forget_in_flight()  # every one belonged to an instance the caller ended
        for export in self.exports.exports():  # their pages were in the dead process
            self.exports.drop(export.name, export.namespace)
        old = self.client
        self.client = self.supervisor.restart(now)  # InferenceUnavailable past the restart budget
        self._info_request = self.client.send(p.InfoRequest())
        self._restarted_at = now
        return old

    def _back(self, reply, adapters: Adapters) -> None:
        self._info_request = None
        same = ("model_name", "page_size", "num_kv_pages", "num_embeds", "num_host_pages")
        if isinstance(reply, p.InfoReply) and all(getattr(reply, f) == getattr(self.info, f) for f in same):
            adapters.reload(self.index)  # sent before any batch: the process answers in order
            log.warning("the new process of %s serves; dispatching again", self.name)
            return
        self.supervisor.kill(f"the new inference process does not match the old one: {reply}")
