"""Resource bookkeeping of the control layer: pure Python, no torch, no I/O.

The inference layer addresses KvPages, Embeds and host-tier slots by physical
id and decides nothing. Here live the pools of those ids (:class:`PhysicalPool`),
each inferlet instance's virtual handles (:class:`ResourceTable`), shared KV
between instances (:class:`ExportRegistry`: exports and named snapshots), and the policy for an exhausted
pool (:func:`choose_victims`).
"""

from .exhaustion import (
    OFFLOAD,
    TERMINATE_NEWEST,
    WAIT,
    Decision,
    ExhaustionPolicy,
    FairShares,
    InstanceUsage,
    choose_victims,
    held_by_client,
)
from .exports import MAX_NAME_BYTES, Export, ExportRegistry, SnapshotLimits
from .pool import PhysicalPool, PoolExhausted
from .slab import U32_MAX, HandleSlab, ResourceError
from .table import BLANK, DEVICE, DISCARDED, HOST, KV_DISCARDED, PagePlacement, QuotaExceeded, ResourceTable

__all__ = [
    "BLANK",
    "DEVICE",
    "DISCARDED",
    "HOST",
    "KV_DISCARDED",
    "MAX_NAME_BYTES",
    "OFFLOAD",
    "TERMINATE_NEWEST",
    "U32_MAX",
    "WAIT",
    "Decision",
    "ExhaustionPolicy",
    "Export",
    "ExportRegistry",
    "FairShares",
    "HandleSlab",
    "InstanceUsage",
    "PagePlacement",
    "PhysicalPool",
    "PoolExhausted",
    "QuotaExceeded",
    "ResourceError",
    "ResourceTable",
    "SnapshotLimits",
    "choose_victims",
    "held_by_client",
]
