"""A child process that dies with its parent: the parent sets ``OVEN_PARENT_PID``, the child calls
:func:`die_with_parent` at start and :func:`parent_alive` from its loop.

Without it, a ``kill -9`` of a control process left its inference process running (gigabytes of
weights, listening on an endpoint the next server would connect to). The kernel's
``PR_SET_PDEATHSIG`` kills the child when the parent dies; comparing the parent pid covers a
parent that died before the child set it, and systems without prctl. A parent stops its child with
:func:`terminate`.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys

PARENT_PID_ENV = "OVEN_PARENT_PID"
_PR_SET_PDEATHSIG = 1


def lifeline_env() -> dict[str, str]:
    """The environment entry a parent gives a child that must not outlive it."""
    return {PARENT_PID_ENV: str(os.getpid())}


def die_with_parent() -> None:
    """Arrange SIGKILL for this process when its parent dies; exit now if it already has."""
    if PARENT_PID_ENV not in os.environ:
        return
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if not parent_alive():
        os._exit(1)


def parent_alive() -> bool:
    """False once the parent named by ``OVEN_PARENT_PID`` has gone (the child was re-parented)."""
    expected = os.environ.get(PARENT_PID_ENV)
    return expected is None or os.getppid() == int(expected)


def terminate(proc: subprocess.Popen, timeout_s: float) -> int:
    """SIGTERM ``proc``, SIGKILL it if it has not exited within ``timeout_s``; its exit status."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()
