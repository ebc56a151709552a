"""What the host functions of an instance may reach beyond the instance itself.

The control loop builds one :class:`HostServices` per inference replica (``replica.py``) and
each instance uses its replica's (``Instance.host``); host functions (``host/``) use it and
nothing else, and nothing in it refers back to the loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from oven.control.resources.exports import ExportRegistry
from oven.proto import inference as p

from .adapters import Adapters
from .allocator import Allocator
from .calls import InferenceCalls
from .children import Children
from .http_client import HttpClient
from .timers import Timers
from .topics import Topics

if TYPE_CHECKING:
    from .instance import Instance
    from .placement import Placement

# Where instance output goes: (instance, "stdout" | "stderr" | "message" | "exit", text or exit code).
EventSink = Callable[["Instance", str, object], None]


@dataclass(frozen=True, slots=True, kw_only=True)
class HostServices:
    info: p.InfoReply  # the served model: name, traits, page size, vocabulary
    calls: InferenceCalls  # calls to the inference process, and the instance's command queues
    allocator: Allocator  # KvPages and Embeds: alloc, dealloc, offload/restore, releasing an export
    adapters: Adapters  # LoRA adapters by name: open-adapter, and which ids a forward may name
    exports: ExportRegistry  # KvPage exports by name, per client
    topics: Topics  # broadcast / subscribe
    timers: Timers  # sleep
    http: HttpClient  # fetch, off the loop thread
    emit: EventSink  # output to the instance's clients
    placement: Placement  # exports across replicas, and moving an instance not placed yet
    children: Children  # launching, waiting for and cancelling child instances
