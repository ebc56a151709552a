"""The control layer's batch scheduler: command queues, batch formation and dispatch policies.

Pure and I/O-free: the runtime submits :class:`Command` objects, asks a
:class:`DispatchPolicy` whether to dispatch (passing its clock as ``now``) and
sends what :meth:`BatchScheduler.form_batch` returns to the inference layer.
"""

from .batcher import Batch, BatchScheduler, SchedulerStats
from .commands import Command, CommandQueue
from .footprint import Embed, HostSlot, KvSlots, Resource, TokenSlot, forward_kv_footprint
from .policy import AdaptivePolicy, DispatchPolicy, EagerPolicy, KPolicy, TPolicy

__all__ = [
    "Batch",
    "BatchScheduler",
    "SchedulerStats",
    "Command",
    "CommandQueue",
    "Embed",
    "HostSlot",
    "KvSlots",
    "Resource",
    "TokenSlot",
    "forward_kv_footprint",
    "AdaptivePolicy",
    "DispatchPolicy",
    "EagerPolicy",
    "KPolicy",
    "TPolicy",
]
