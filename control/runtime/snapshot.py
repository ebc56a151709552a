"""What the control loop shows of itself to the client-facing server, read at one moment."""

from __future__ import annotations

from dataclasses import dataclass

from oven.control.resources import Export
from oven.control.scheduling import SchedulerStats

from .instance import InstanceRecord


@dataclass(frozen=True, slots=True)
class LoopSnapshot:
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
