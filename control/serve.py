"""``oven serve``: an inference process plus the control loop and its client RPC, until Ctrl-C or SIGTERM."""

from __future__ import annotations

import gc
import logging
import os
import signal
import sys
from collections.abc import Callable

from oven.inference.config import InferenceConfig
from oven.proto.auth import AuthError
from oven.proto.endpoints import EndpointError, sweep_stale_private_folders
from oven.proto.lifeline import die_with_parent, parent_alive

from .config import ControlConfig
from .keyring import Keyring
from .metrics_http import MetricsPortError, MetricsServer
from .remote import RemoteInference, parse_remote_replicas
from .runtime.adapters import LOADED
from .runtime.loop import ControlLoop
from .server import ControlServer
from .supervisor import InferenceSupervisor, InferenceUnavailable

log = logging.getLogger(__name__)

INFERENCE_START_S = 300.0  # to load the model
GC_YOUNG_THRESHOLD = 10_000  # Python's default, 700, runs a young pass every few host calls


def settle_heap() -> None:
    """Tune the cyclic collector for a long-running control process; call once, after start-up.

    Everything alive at start-up (modules, the loop, the linker) lives as long as the
    process, yet every full pass of the collector walks it again, stalling the loop:
    gc.freeze() takes it out of the collector's sight. A larger young generation
    makes passes rarer; per-call garbage is freed by reference counting anyway.
    Together they cut the loop's CPU per token by about a tenth (bench/control_overhead.py).
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])


def serve(inference: InferenceConfig, control: ControlConfig, verbose: bool = True,
          on_ready: Callable[[str], None] | None = None) -> int:
    """Serve until Ctrl-C or SIGTERM; ``on_ready(endpoint)`` is called once clients can be served."""
    die_with_parent()  # an embedded server (oven run) goes with the command that started it
    stopping = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.append(True))
    sweep_stale_private_folders()  # what killed servers left in the temporary directory
    try:
        server = ControlServer(control.endpoint, Keyring(control.state_path))  # an endpoint in use fails here
    except (EndpointError, AuthError) as exc:
        print(f"oven: {exc}", file=sys.stderr)
        return 1
    try:
        metrics = MetricsServer(control.metrics_port) if control.metrics_port else None  # a port in use: now
    except MetricsPortError as exc:
        print(f"oven: {exc}", file=sys.stderr)
        server.close()
        return 1
    supervisors = start_replicas(inference, control, verbose)
    if supervisors is None:
        server.close()
        if metrics is not None:
            metrics.close()
        return 1
    try:
        server.loop = loop = ControlLoop([s.client() for s in supervisors], control, server.on_event, supervisors)
        settle_heap()
        print(f"oven: serving {loop.info.model_name} on {loop.info.device}; clients connect to {server.endpoint}",
              file=sys.stderr, flush=True)
        if metrics is not None:
            metrics.registry.loop = loop
            print(f"oven: Prometheus metrics on {metrics.url}", file=sys.stderr, flush=True)
        if adapters := loop.adapters.entries():
            print("oven: LoRA adapters: " + ", ".join(f"{a.name} (id {a.adapter_id})" if a.state == LOADED else
                                                    f"{a.name} ({a.state}: {a.error})" for a in adapters),
                  file=sys.stderr, flush=True)
        if on_ready is not None:
            on_ready(server.endpoint)
        try:
            server.serve_forever(lambda: bool(stopping) or not parent_alive())
        except InferenceUnavailable as exc:
            print(f"oven: {exc}", file=sys.stderr, flush=True)
            loop.close()
            return 1
        print("oven: shutting down", file=sys.stderr, flush=True)
        loop.close()
        return 0
    finally:
        for supervisor in supervisors:
            supervisor.stop()
        server.close()
        if metrics is not None:
            metrics.close()


def start_replicas(inference: InferenceConfig, control: ControlConfig,
                   verbose: bool) -> list[InferenceSupervisor | RemoteInference] | None:
    """The replicas, local first: the ``data_parallel`` inference processes, loading side by side, then
    the ``remote_replicas``, reached first (an unreachable host fails within seconds, not after a
    model's load); None (said why) if one cannot serve.

    On a CPU each rank of each local replica gets an equal share of the cores but the control process's
    one, unless ``torch_threads`` says otherwise; on CUDA replica k sees the k-th group of
    ``tensor_parallel`` devices of ``replica_devices`` alone."""
    n = control.data_parallel
    supervisors: list[InferenceSupervisor] = []
    remotes: list[RemoteInference] = []
    try:
        for endpoint, token in parse_remote_replicas(control.remote_replicas):
            remotes.append(RemoteInference(endpoint, token))
        if n + len(remotes) == 0:
            raise ValueError("no inference replica: --data-parallel 0 needs --remote-replicas")
        if n > 1 and inference.endpoint:
            raise ValueError("--data-parallel needs private inference endpoints (no --endpoint)")
        if inference.tp_rank:
            raise ValueError(f"oven serve's inference process is rank 0 of its group, not {inference.tp_rank}: "
                             "start other ranks with `oven inference --tp-rank K`")
        if n > 1 and inference.tp_rank is not None:
            raise ValueError("--tp-rank 0 with --data-parallel: the replicas' groups would share one MASTER_PORT; "
                             "leave --tp-rank out (each group then meets on a port of its own)")
        tp = inference.tensor_parallel
        if n > 1 and inference.torch_threads is None:  # each rank of each replica an equal share
            inference = inference.replace(torch_threads=max(1, ((os.cpu_count() or 1) - 1) // (n * tp)))
        # replica k sees its tensor-parallel group's devices alone: the k-th tp of them, in turn
        devices = [d.strip() for d in control.replica_devices.split(",") if d.strip()]
        if n:
            print(f"oven: starting {'the inference process' if n == 1 else f'{n} inference processes'} "
                  f"({inference.model}) ...", file=sys.stderr, flush=True)
        for k in range(n):
            env = {"CUDA_VISIBLE_DEVICES": ",".join(devices[(k * tp + r) % len(devices)] for r in range(tp))
                   } if devices else None
            supervisors.append(InferenceSupervisor(inference, verbose, control.inference_restarts, None, env,
                                                   f"replica {k}" if n > 1 else ""))
        for k, supervisor in enumerate(supervisors):
            try:
                supervisor.wait_ready(INFERENCE_START_S)
            except (RuntimeError, TimeoutError) as exc:
                raise RuntimeError(f"inference replica {k}: {exc}" if n > 1 else str(exc)) from None
    except (ValueError, RuntimeError) as exc:
        print(f"oven: {exc}", file=sys.stderr)
        for supervisor in supervisors + remotes:
            supervisor.stop()
        return None
    return supervisors + remotes
