"""``oven serve``: an inference process plus the control loop and its client RPC, until Ctrl-C or SIGTERM."""

from __future__ import annotations

import logging
import signal
import sys

from oven.inference.config import InferenceConfig

from .config import ControlConfig
from .inference_process import start_inference_process
from .runtime.loop import ControlLoop
from .server import ControlServer

log = logging.getLogger(__name__)


def serve(inference: InferenceConfig, control: ControlConfig, verbose: bool = True) -> int:
    stopping = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.append(True))
    print(f"oven: starting the inference process ({inference.model}) ...", file=sys.stderr, flush=True)
    try:
        process = start_inference_process(inference, echo_stderr=verbose)
    except (RuntimeError, TimeoutError) as exc:
        print(f"oven: {exc}", file=sys.stderr)
        return 1
    server = None
    try:
        loop = ControlLoop(process.client(), control, lambda inst, kind, payload: server.on_event(inst, kind, payload))
        server = ControlServer(loop, control.control_endpoint)
        print(f"oven: serving {loop.info.model_name} on {loop.info.device}; clients connect to "
              f"{control.control_endpoint} (inference at {inference.endpoint})", file=sys.stderr, flush=True)
        server.serve_forever(lambda: bool(stopping))
        print("oven: shutting down", file=sys.stderr, flush=True)
        loop.close()
        return 0
    finally:
        process.stop()
