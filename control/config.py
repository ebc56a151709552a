"""Typed configuration of the control process (merged by oven.proto.config_loader)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from oven.control.adapter_store import default_adapter_dir
from oven.control.resources.exhaustion import POLICY_NAMES as EXHAUSTION_POLICIES
from oven.control.resources.exhaustion import ExhaustionPolicy
from oven.control.runtime.http_allow import AllowList
from oven.control.scheduling.chunks import AUTO
from oven.control.scheduling.interception import NAMES as INTERCEPTION_POLICIES
from oven.control.scheduling.interception import InterceptionPolicy
from oven.control.scheduling.policy import DEFAULT_K, DEFAULT_T_S, DispatchPolicy
from oven.control.scheduling.policy import NAMES as DISPATCH_POLICIES
from oven.proto.auth import check_path, default_cache_dir, default_state_dir
from oven.proto.config_loader import blocking_file, setting


def default_program_dir() -> str:
    return str(default_cache_dir() / "programs")


@dataclass(frozen=True, slots=True)
class ControlConfig:
    control_endpoint: str = setting("", "where clients connect: tcp://HOST:PORT serves other machines too; "
                                        "\"\" = ipc://STATE_DIR/control.sock")
    state_dir: str = setting("", "keys, clients and the operator's token; \"\" = $OVEN_CACHE_DIR/server or "
                                 "~/.cache/oven/server")
    program_dir: str = setting("", "uploaded programs; \"\" = $OVEN_CACHE_DIR/programs or ~/.cache/oven/programs")
    adapter_dir: str = setting("", "LoRA adapters loaded at start; \"\" = $OVEN_CACHE_DIR/adapters or "
                                   "~/.cache/oven/adapters")
    dispatch_policy: str = setting("adaptive", "when queued commands go out as a batch: adaptive (once the device "
                                               "is idle), eager (at once), k (once k wait), t (once the oldest "
                                               "waited t)", choices=DISPATCH_POLICIES)
    dispatch_k: int = setting(DEFAULT_K, "the k policy: batch size that triggers a dispatch")
    dispatch_t_ms: float = setting(DEFAULT_T_S * 1000, "the t policy: oldest wait (ms) that triggers a dispatch")
    exhaustion_policy: str = setting("preempt", "when the KvPage pool runs out: preempt (swap out instances waiting "
                                                "on I/O, then newer ones), terminate-newest, wait for pages, or "
                                                "offload (swap out those waiting on I/O)", choices=EXHAUSTION_POLICIES)
    interception_policy: str = setting("infercept", "the KV of an instance waiting on I/O: infercept (whichever of "
                                                    "preserve, swap and discard wastes least), or always one of them",
                                       choices=INTERCEPTION_POLICIES)
    prefill_chunk_tokens: int = setting(AUTO, "a forward of more tokens (a long prompt) goes to the device in "
                                              "chunks of this many, one after another, so that other instances' "
                                              "decode steps run beside each; batches hold at most twice this many "
                                              "tokens; -1 = by the device (128 on a CPU, 2048 on a GPU); 0 = "
                                              "forwards go whole, batches up to the inference process's "
                                              "max_batch_tokens")
    max_instances: int = setting(1024, "instances running at once, all clients together")
    max_instances_per_client: int = setting(256, "instances running at once per client (the operator is exempt)")
    max_launch_depth: int = setting(4, "how deep inferlets may launch inferlets: a child of a client's launch is at "
                                       "depth 1, its child at 2")
    max_children_per_instance: int = setting(64, "children one instance holds at once (running, or ended and not "
                                                 "yet waited for)")
    finished_instances: int = setting(100, "ended instances `oven ps` still shows (and `oven attach` replays), "
                                           "newest")
    inbox_messages: int = setting(1024, "client messages waiting in one instance's inbox")
    inbox_mib: int = setting(16, "bytes (MiB) waiting in one instance's inbox")
    instance_memory_mib: int = setting(512, "one linear memory of one instance (MiB)")
    client_memory_mib: int = setting(16384, "memory (MiB) of all one client's instances together, chiefly their "
                                            "linear memories; its runner ends the largest past it (a Python "
                                            "inferlet holds about 12 MiB)")
    max_runners: int = setting(64, "runner processes at once: clients with instances running (one each)")
    runner_idle_s: float = setting(60.0, "a runner whose client has no instance left stops after this many seconds")
    runner_grace_s: float = setting(30.0, "a runner silent this many seconds past a slice's deadline, with slices "
                                          "to run, is killed")
    slice_ms: int = setting(2000, "longest a guest may run between two waits (ms)")
    max_kv_pages_per_instance: int = setting(4096, "KvPages one instance may hold")
    max_embeds_per_instance: int = setting(4096, "embeds one instance may hold")
    max_snapshots_per_client: int = setting(64, "named KV snapshots one client keeps at once")
    max_snapshot_pages_per_client: int = setting(4096, "KvPages one client's named KV snapshots hold together")
    http_allow: str = setting("", "hosts inferlets may fetch from: comma-separated host:port (a bare host: 80 for "
                                  "http, 443 for https; [v6addr]:port); \"\" = none")
    http_timeout_s: float = setting(30.0, "one fetch, connect to last body byte (seconds)")
    http_fetches_per_instance: int = setting(2, "fetches in flight at once per instance; further ones wait in its "
                                                "queue")
    http_queue_per_instance: int = setting(64, "fetches waiting behind those; one more fails at once")
    http_workers: int = setting(8, "threads shared by every instance's fetches")
    http_max_body_mib: int = setting(16, "a larger response (MiB) fails the fetch")
    lease_s: float = setting(10.0, "a client silent this many seconds loses its non-detached instances")
    inference_timeout_s: float = setting(120.0, "a batch unanswered this many seconds: the inference process is "
                                                "hung")
    inference_restarts: int = setting(5, "restarts of a dead inference process within 10 minutes before giving up")
    data_parallel: int = setting(1, "local inference processes, each a replica of the model with KV of its own "
                                    "(0: remote replicas only)")
    replica_devices: str = setting("", "CUDA device numbers, comma-separated: replica k gets the k-th (the k-th "
                                       "group of --tensor-parallel devices), in turn; \"\" = the default device")
    remote_replicas: str = setting("", "replicas on other hosts, after the local ones: tcp://HOST:PORT=TOKEN,... "
                                       "(TOKEN as `oven inference --join KEYFILE` printed it there, or @FILE)")
    metrics_port: int = setting(0, "port on 127.0.0.1 serving the control process's Prometheus metrics at "
                                   "/metrics; 0 = off")
    # Parsed from the settings above once, here (not settings: no flag, file entry or variable names them).
    dispatch: DispatchPolicy = field(init=False, repr=False, compare=False)
    exhaustion: ExhaustionPolicy = field(init=False, repr=False, compare=False)
    interception: InterceptionPolicy = field(init=False, repr=False, compare=False)
    http_allow_list: AllowList = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("dispatch_k", "max_instances", "max_instances_per_client", "max_launch_depth",
                     "max_children_per_instance", "inbox_messages", "inbox_mib",
                      "instance_memory_mib", "client_memory_mib", "max_runners", "slice_ms",
                      "max_kv_pages_per_instance", "max_embeds_per_instance", "max_snapshots_per_client",
                      "max_snapshot_pages_per_client", "http_fetches_per_instance",
                      "http_workers", "http_max_body_mib"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if min(self.dispatch_t_ms, self.lease_s, self.http_timeout_s, self.inference_timeout_s, self.runner_idle_s,
               self.runner_grace_s) <= 0:
            raise ValueError("dispatch_t_ms, lease_s, http_timeout_s, inference_timeout_s, runner_idle_s and "
                             "runner_grace_s must be positive")
        if not 0 <= self.metrics_port <= 65535:
            raise ValueError(f"metrics_port must be from 0 (off) to 65535, not {self.metrics_port}")
        if self.data_parallel < 0:
            raise ValueError("data_parallel must be 0 (remote replicas only) or more")
        if not all(d.strip().isdigit() for d in self.replica_devices.split(",")) and self.replica_devices:
            raise ValueError(f"replica_devices must be CUDA device numbers separated by commas, not "
                             f"{self.replica_devices!r}")
        if min(self.http_queue_per_instance, self.inference_restarts, self.finished_instances) < 0:
            raise ValueError("http_queue_per_instance, inference_restarts and finished_instances must not be negative")
        if self.prefill_chunk_tokens < AUTO:
            raise ValueError(f"prefill_chunk_tokens must be -1 (by the device), 0 (off) or a number of tokens, not "
                             f"{self.prefill_chunk_tokens}")
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
