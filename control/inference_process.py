"""Start and stop an inference process from the control side.

The child runs ``python -m oven.inference.server`` with the flags of an
:class:`InferenceConfig`; :func:`start_inference_process` returns once the
child answers an ``info`` request, or raises with the tail of its stderr if it
dies first. The control layer itself never imports torch.

The child gets a fresh CurveZMQ key pair and admits only the key of this side, so
nothing else can use it, and this side, which knows the child's public key, cannot
be answered by anything else on that endpoint. It dies with its parent
(:mod:`oven.proto.lifeline`).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections import deque

from oven.inference.config import InferenceConfig
from oven.proto import inference as p
from oven.proto.auth import Keypair, Token, inference_keys_env
from oven.proto.config_loader import config_to_argv
from oven.proto.endpoints import PRIVATE_PREFIX, ipc_path
from oven.proto.lifeline import lifeline_env, terminate

from .inference_client import InferenceClient


class InferenceProcess:
    """``env``: more environment for the child (a replica's CUDA device); ``label`` starts each line of
    its stderr that is echoed (which replica said it)."""

    def __init__(self, config: InferenceConfig, echo_stderr: bool = False, env: dict[str, str] | None = None,
                 label: str = ""):
        self.config = config
        cmd = [sys.executable, "-m", "oven.inference.server", *config_to_argv(config)]
        self._stderr_tail: deque[str] = deque(maxlen=40)
        server_keys, self._client_keys = Keypair.generate(), Keypair.generate()
        self.token = Token(server_keys.public, self._client_keys)
        env = {**os.environ, **(env or {}), **inference_keys_env(server_keys, self._client_keys.public),
               **lifeline_env()}
        # A session of its own: a Ctrl-C at the terminal goes to its parent alone, which stops it (its
        # lifeline ends it if the parent dies), rather than killing it mid-batch as if it had crashed.
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
        self._pump = threading.Thread(target=self._read_stderr, args=(echo_stderr, label), daemon=True)
        self._pump.start()
        self.info: p.InfoReply | None = None

    def _read_stderr(self, echo: bool, label: str) -> None:
        for line in self.proc.stderr:
            self._stderr_tail.append(line)
            if echo:
                sys.stderr.write(label + line)
                sys.stderr.flush()

    def wait_ready(self, timeout_s: float) -> p.InfoReply:
        deadline = time.monotonic() + timeout_s
        with self.client() as client:
            request_id = client.send(p.InfoRequest())
            while True:
                if self.proc.poll() is not None:
                    self._pump.join(timeout=2)
                    raise RuntimeError(f"inference process exited with status {self.proc.returncode}:\n"
                                       + "".join(self._stderr_tail))
                try:
                    self.info = client.wait(request_id, timeout_s=0.2)
                    return self.info
                except TimeoutError:
                    if time.monotonic() > deadline:
                        self.stop()
                        raise TimeoutError(f"inference process not ready after {timeout_s:.0f}s:\n"
                                           + "".join(self._stderr_tail)) from None

    def client(self, timeout_s: float = 600.0) -> InferenceClient:
        """A new client of this process (the only kind it admits)."""
        return InferenceClient(self.config.endpoint, timeout_s, token=self.token)

    @property
    def stderr_tail(self) -> str:
        return "".join(self._stderr_tail)

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL if it has not exited within ``timeout_s``."""
        terminate(self.proc, timeout_s)
        path = ipc_path(self.config.endpoint)
        if path is not None:
            path.unlink(missing_ok=True)
            if path.parent.name.startswith(PRIVATE_PREFIX):
                with contextlib.suppress(OSError):
                    path.parent.rmdir()
        return self.proc.returncode

    def __enter__(self) -> "InferenceProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_inference_process(config: InferenceConfig, timeout_s: float = 300.0,
                            echo_stderr: bool = False) -> InferenceProcess:
    process = InferenceProcess(config, echo_stderr)
    process.wait_ready(timeout_s)
    return process
