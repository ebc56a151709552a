"""What the control loop shows of itself to the client-facing server, read at one moment."""

from __future__ import annotations

from dataclasses import dataclass

from oven.control.resources.exports import Export
from oven.control.scheduling.batcher import SchedulerStats
from oven.proto.control import InterceptionProfile

from .instance import InstanceRecord


@dataclass(frozen=True, slots=True)
class ReplicaLoad:
    """One inference replica's share of the work (``oven stats`` shows each when there are several)."""

    index: int
    serving: bool  # False while a restarted process loads its model
    num_instances: int  # living there
    num_free_kv_pages: int
    stats: SchedulerStats  # of its batches


@dataclass(frozen=True, slots=True)
class LoopSnapshot:
    """Counts over every inference replica (``replicas`` splits them)."""

    instances: tuple[InstanceRecord, ...]  # running, in launch order
    finished: tuple[InstanceRecord, ...]  # ended, oldest first (the newest MAX_FINISHED_RECORDS)
    exports: tuple[Export, ...]  # KvPage exports of every client, oldest first
    stats: SchedulerStats
    num_free_kv_pages: int
    num_free_embeds: int
    num_free_host_slots: int
    num_swapped_out: int = 0  # the interception policy's moves since the loop started (Interceptions)
    num_swapped_in: int = 0
    num_discarded: int = 0
    interception_policy: str = ""
    profile: InterceptionProfile | None = None  # the interception policy's costs now (ControlLoop.interception_profile)
    device_s: float = 0.0  # InferenceCalls.device_s / rewrite_s
    rewrite_s: float = 0.0
    intercepted_page_s: float = 0.0  # Interceptions.intercepted_page_s / contended_page_s
    contended_page_s: float = 0.0
    num_preempted: int = 0  # Allocator.num_preempted
    rewrite_page_s: float = 0.0  # InferenceCalls.rewrite_page_s
    copy_s: float = 0.0  # Interceptions.copy_s / copy_page_s
    copy_page_s: float = 0.0
    replicas: tuple[ReplicaLoad, ...] = ()  # the counts above, per inference replica
    num_split_forwards: int = 0  # InferenceCalls.num_split / num_chunks: long forwards sent in chunks
    num_prefill_chunks: int = 0
