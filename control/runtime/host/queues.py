"""``queues``: an instance's command queues (queue 0 exists from the start)."""

from __future__ import annotations

from .. import futures as f


def synchronize(inst, q: int) -> int:
    fut = inst.futures.create(f.UNIT)
    inst.queue(q).when_drained(lambda: inst.futures.complete(fut))
    return fut.handle


def set_priority(inst, q: int, priority: int) -> None:
    inst.host.calls.set_priority(inst, q, priority)


FUNCS = {
    "create-queue": lambda inst, priority: inst.host.calls.open_queue(inst, priority),
    "destroy-queue": lambda inst, q: inst.host.calls.close_queue(inst, q),
    "set-priority": set_priority,
    "synchronize": synchronize,
}
