"""``runtime``: sleep, the exit code and the pause hint (the runner answers arguments, identity, clock,
models and traits itself)."""

from __future__ import annotations

import time

from .. import futures as f


def sleep(inst, ms: int) -> int:
    fut = inst.futures.create(f.UNIT, io=True)
    inst.host.timers.add(time.monotonic() + ms / 1000.0, lambda: inst.futures.complete(fut), inst.instance_id)
    return fut.handle


def set_exit_code(inst, code: int) -> None:
    inst.exit_code = code


def pause_hint(inst, ms: int) -> None:
    """How long the instance's next (or current) wait on I/O should last; cleared when that wait ends."""
    inst.pause_until = time.monotonic() + ms / 1000.0


FUNCS = {"sleep": sleep, "set-exit-code": set_exit_code, "pause-hint": pause_hint}
