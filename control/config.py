"""Typed configuration of the control process (merged by oven.proto.config_loader)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from oven.control.runtime.http_allow import AllowList

DEFAULT_CONTROL_ENDPOINT = "tcp://127.0.0.1:7430"
DISPATCH_POLICIES = ("adaptive", "eager", "k", "t")
EXHAUSTION_POLICIES = ("terminate-newest", "wait", "offload")


def default_program_dir() -> str:
    root = os.environ.get("OVEN_CACHE_DIR") or str(Path.home() / ".cache" / "oven")
    return str(Path(root) / "programs")


@dataclass(frozen=True, slots=True)
class ControlConfig:
    control_endpoint: str = DEFAULT_CONTROL_ENDPOINT
    program_dir: str = ""  # "" = $OVEN_CACHE_DIR/programs or ~/.cache/oven/programs
    dispatch_policy: str = "adaptive"
    dispatch_k: int = 32  # the k policy: batch size that triggers a dispatch
    dispatch_t_ms: float = 5.0  # the t policy: oldest wait that triggers a dispatch
    exhaustion_policy: str = "terminate-newest"
    max_instances: int = 1024
    instance_memory_mib: int = 512
    slice_ms: int = 2000  # longest a guest may run between two waits
    max_kv_pages_per_instance: int = 4096
    max_embeds_per_instance: int = 4096
    http_allow: str = ""  # comma-separated host:port (a bare host: 80 for http, 443 for https; [v6addr]:port)
    http_timeout_s: float = 30.0  # one fetch, connect to last body byte
    http_fetches_per_instance: int = 2  # in flight at once; an instance's further fetches wait in its queue
    http_queue_per_instance: int = 64  # fetches waiting behind those; one more fails at once
    http_workers: int = 8  # threads shared by every instance's fetches
    http_max_body_mib: int = 16  # a larger response fails the fetch
    lease_s: float = 10.0  # a client silent this long loses its non-detached instances

    def __post_init__(self) -> None:
        if self.dispatch_policy not in DISPATCH_POLICIES:
            raise ValueError(f"dispatch_policy must be one of {DISPATCH_POLICIES}, not {self.dispatch_policy!r}")
        if self.exhaustion_policy not in EXHAUSTION_POLICIES:
            raise ValueError(f"exhaustion_policy must be one of {EXHAUSTION_POLICIES}")
        for field in ("dispatch_k", "max_instances", "instance_memory_mib", "slice_ms",
                      "max_kv_pages_per_instance", "max_embeds_per_instance", "http_fetches_per_instance",
                      "http_workers", "http_max_body_mib"):
            if getattr(self, field) <= 0:
                raise ValueError(f"{field} must be positive")
        if self.dispatch_t_ms <= 0 or self.lease_s <= 0 or self.http_timeout_s <= 0:
            raise ValueError("dispatch_t_ms, lease_s and http_timeout_s must be positive")
        if self.http_queue_per_instance < 0:
            raise ValueError("http_queue_per_instance must not be negative")
        AllowList.parse(self.http_allow)  # a bad entry fails here, at start, naming the entry

    @property
    def programs_path(self) -> Path:
        return Path(self.program_dir or default_program_dir())

    @property
    def http_allow_list(self) -> AllowList:
        return AllowList.parse(self.http_allow)
