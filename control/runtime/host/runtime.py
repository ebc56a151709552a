"""``runtime``: arguments, identity, clock and sleep, exit code, models and traits."""

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


FUNCS = {
    "arguments": lambda inst: list(inst.args),
    "instance-id": lambda inst: inst.instance_id,
    "now-ms": lambda inst: int(time.monotonic() * 1000),
    "sleep": sleep,
    "set-exit-code": set_exit_code,
    "models": lambda inst: [inst.host.info.model_name],
    "available-traits": lambda inst: [t.replace("_", "-") for t in inst.host.info.traits],
    "page-size": lambda inst: inst.host.info.page_size,
    "pause-hint": pause_hint,
}
