"""Keeping an inference process alive for the control loop: notice its death, start another.

The control loop asks :meth:`InferenceSupervisor.check` every turn (a ``waitpid``
that does not block, at most every ``CHECK_S``); a process that exited, or one
the loop found hung and asked to :meth:`kill`, yields a reason. The loop fails
what depended on it and calls :meth:`restart`, which starts a new process without
waiting for it (the model loads while the loop serves clients) and returns its
client. Restarts are bounded: past ``max_restarts`` within ``RESTART_WINDOW_S`` it
raises :class:`InferenceUnavailable` and the server gives up rather than loop.
"""

from __future__ import annotations

import dataclasses
import logging

from oven.inference.config import InferenceConfig
from oven.proto.endpoints import private_endpoint

from .inference_client import InferenceClient
from .inference_process import InferenceProcess

log = logging.getLogger(__name__)

CHECK_S = 0.05
RESTART_WINDOW_S = 600.0


class InferenceUnavailable(RuntimeError):
    pass


class InferenceSupervisor:
    def __init__(self, config: InferenceConfig, echo_stderr: bool = False, max_restarts: int = 5,
                 start_timeout_s: float | None = 300.0, env: dict[str, str] | None = None, name: str = ""):
        """Start the first process and wait until it serves (raises RuntimeError/TimeoutError if it cannot);
        with ``start_timeout_s`` None, return at once (:meth:`wait_ready` then; several load side by side).
        ``env`` and ``name`` (a replica's device, and what its log lines start with) go to every process."""
        self.config, self.echo_stderr, self.max_restarts = config, echo_stderr, max_restarts
        self._env, self._label = env, f"[{name}] " if name else ""
        self.process = self._start()
        if start_timeout_s is not None:
            self.wait_ready(start_timeout_s)
        self._restarts: list[float] = []
        self._next_check = 0.0
        self._killed_because: str | None = None

    def _next_config(self) -> InferenceConfig:
        # A private endpoint is new at every start: nothing of the old process can be reached there.
        return self.config if self.config.endpoint else dataclasses.replace(self.config, endpoint=private_endpoint())

    def _start(self) -> InferenceProcess:
        return InferenceProcess(self._next_config(), self.echo_stderr, self._env, self._label)

    def wait_ready(self, timeout_s: float) -> None:
        """Until the process serves; RuntimeError/TimeoutError (it is stopped) if it cannot."""
        self.process.wait_ready(timeout_s)

    def client(self) -> InferenceClient:
        return self.process.client()

    def check(self, now: float) -> str | None:
        """Why the process is gone, or None while it runs."""
        if now < self._next_check:
            return None
        self._next_check = now + CHECK_S
        status = self.process.proc.poll()
        if status is None:
            return None
        if self._killed_because:
            return self._killed_because
        tail = [line.strip() for line in self.process.stderr_tail.splitlines() if line.strip()]
        cause = f"killed by signal {-status}" if status < 0 else f"exited with status {status}"
        return cause + (f" ({tail[-1]})" if tail and status > 0 else "")

    def kill(self, reason: str) -> None:
        """End a process that stopped answering; :meth:`check` then reports ``reason``."""
        self._killed_because = reason
        self.process.proc.kill()

    def restart(self, now: float) -> InferenceClient:
        """Start a new process (not waiting for it to load) and return its client."""
        self._restarts = [t for t in self._restarts if now - t < RESTART_WINDOW_S] + [now]
        self.process.stop(timeout_s=5)
        if len(self._restarts) > self.max_restarts:
            raise InferenceUnavailable(f"the inference process died {len(self._restarts)} times in "
                                       f"{RESTART_WINDOW_S / 60:.0f} minutes; giving up (oven serve "
                                       "--inference-restarts)")
        log.warning("%srestarting the inference process (%d of at most %d within %.0f minutes)",
                    self._label, len(self._restarts), self.max_restarts, RESTART_WINDOW_S / 60)
        self._killed_because = None
        self.process = self._start()
        return self.process.client()

    def stop(self) -> None:
        self.process.stop()
