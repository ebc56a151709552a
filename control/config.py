"""Typed configuration of the control process (merged by oven.proto.config_loader)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from oven.control.adapter_store import default_adapter_dir
from oven.control.resources.exhaustion import ExhaustionPolicy
from oven.control.runtime.http_allow import AllowList
from oven.control.scheduling.interception import InterceptionPolicy
from oven.control.scheduling.policy import DEFAULT_K, DEFAULT_T_S, DispatchPolicy
from oven.proto.auth import check_path, default_cache_dir, default_state_dir
from oven.proto.config_loader import blocking_file


def default_program_dir() -> str:
    return str(default_cache_dir() / "programs")


@dataclass(frozen=True, slots=True)
class ControlConfig:
    control_endpoint: str = ""  # "" = ipc://STATE_DIR/control.sock; tcp://HOST:PORT serves other machines too
    state_dir: str = ""  # keys, clients, the operator's token; "" = $OVEN_CACHE_DIR/server or ~/.cache/oven/server
    program_dir: str = ""  # "" = $OVEN_CACHE_DIR/programs or ~/.cache/oven/programs
    adapter_dir: str = ""  # LoRA adapters loaded at start; "" = $OVEN_CACHE_DIR/adapters or ~/.cache/oven/adapters
    dispatch_policy: str = "adaptive"  # adaptive | eager | k | t (scheduling.policy.NAMES)
    dispatch_k: int = DEFAULT_K  # the k policy: batch size that triggers a dispatch
    dispatch_t_ms: float = DEFAULT_T_S * 1000  # the t policy: oldest wait that triggers a dispatch
    exhaustion_policy: str = "preempt"  # preempt | terminate-newest | wait | offload (resources.exhaustion)
    interception_policy: str = "infercept"  # infercept | preserve | discard | swap (scheduling.interception)
    max_instances: int = 1024
    max_instances_per_client: int = 256  # running at once, per client but the operator
    finished_instances: int = 100  # ended instances `oven ps` still shows (and `oven attach` replays), newest
    inbox_messages: int = 1024  # client messages waiting in one instance's inbox
    inbox_mib: int = 16  # and their bytes
    instance_memory_mib: int = 512  # one linear memory of one instance
    # Memory of all one client's instances together, what their linear memories grew to chiefly (its runner
    # ends the largest past it; control/runner/memory.py): a Python inferlet holds about 12 MiB of it.
    client_memory_mib: int = 16384
    max_runners: int = 64  # runner processes at once: clients with instances running (one each)
    runner_idle_s: float = 60.0  # a runner whose client has no instance left stops after this
    runner_grace_s: float = 30.0  # a runner silent this long past a slice's deadline, with slices to run, is killed
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
    inference_timeout_s: float = 120.0  # a batch unanswered this long: the inference process is hung
    inference_restarts: int = 5  # restarts of a dead inference process within 10 minutes before giving up
    data_parallel: int = 1  # local inference processes, each a replica of the model with KV of its own
    # CUDA device numbers, comma-separated: replica k gets the k-th (the k-th group of --tensor-parallel
    # devices), in turn; "" = the default device for every replica
    replica_devices: str = ""
    # Replicas on other hosts, after the local ones: tcp://HOST:PORT=TOKEN,... (each TOKEN as `oven inference
    # --join KEYFILE` printed it there, or @FILE holding it); control/remote.py
    remote_replicas: str = ""
    # Parsed from the settings above once, here (not settings: no flag, file entry or variable names them).
    dispatch: DispatchPolicy = field(init=False, repr=False, compare=False)
    exhaustion: ExhaustionPolicy = field(init=False, repr=False, compare=False)
    interception: InterceptionPolicy = field(init=False, repr=False, compare=False)
    http_allow_list: AllowList = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("dispatch_k", "max_instances", "max_instances_per_client", "inbox_messages", "inbox_mib",
                      "instance_memory_mib", "client_memory_mib", "max_runners", "slice_ms",
                      "max_kv_pages_per_instance", "max_embeds_per_instance", "http_fetches_per_instance",
                      "http_workers", "http_max_body_mib"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if min(self.dispatch_t_ms, self.lease_s, self.http_timeout_s, self.inference_timeout_s, self.runner_idle_s,
               self.runner_grace_s) <= 0:
            raise ValueError("dispatch_t_ms, lease_s, http_timeout_s, inference_timeout_s, runner_idle_s and "
                             "runner_grace_s must be positive")
        if self.data_parallel < 0:
            raise ValueError("data_parallel must be 0 (remote replicas only) or more")
        if not all(d.strip().isdigit() for d in self.replica_devices.split(",")) and self.replica_devices:
            raise ValueError(f"replica_devices must be CUDA device numbers separated by commas, not "
                             f"{self.replica_devices!r}")
        if min(self.http_queue_per_instance, self.inference_restarts, self.finished_instances) < 0:
            raise ValueError("http_queue_per_instance, inference_restarts and finished_instances must not be negative")
        parsed = {  # a bad name or entry fails here, at start, naming it
            "dispatch": DispatchPolicy.named(self.dispatch_policy, k=self.dispatch_k, t_s=self.dispatch_t_ms / 1000),
            "exhaustion": ExhaustionPolicy(self.exhaustion_policy),
            "interception": InterceptionPolicy(self.interception_policy),
            "http_allow_list": AllowList.parse(self.http_allow),
        }
        for name, value in parsed.items():
            object.__setattr__(self, name, value)  # frozen: set once, here
        # A file where a folder must be fails here, naming the setting, not after the model has loaded; so
        # does a folder that another local user could have written (UnsafePath, see check_path).
        for name, folder in (("state_dir", self.state_path), ("program_dir", self.programs_path),
                             ("adapter_dir", self.adapters_path)):
            file = blocking_file(folder)
            if file is not None:
                raise ValueError(f"{name} {folder}: {'it' if file == folder else file} is a file, not a folder")
            check_path(folder, name)

    @property
    def programs_path(self) -> Path:
        return Path(self.program_dir or default_program_dir())

    @property
    def adapters_path(self) -> Path:
        return Path(self.adapter_dir) if self.adapter_dir else default_adapter_dir()

    @property
    def state_path(self) -> Path:
        return Path(self.state_dir) if self.state_dir else default_state_dir()

    @property
    def endpoint(self) -> str:
        """Where clients connect: ``control_endpoint``, or the socket in the state directory."""
        return self.control_endpoint or f"ipc://{self.state_path / 'control.sock'}"
