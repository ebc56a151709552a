"""Applying the host calls a slice made, as its runner reports them, to the instance that made them.

The runner gave the guest every call's immediate value already (a future's handle, a queue id);
the host functions here make the same ones in the same order, and a disagreement is a broken
runner, which costs the instance. The guest's WASI output travels as two more calls, ``stdout``
and ``stderr``, so that it reaches clients in order with the messages it sends.
"""

from __future__ import annotations

from collections.abc import Callable

from . import host


def _output(stream: str) -> Callable:
    return lambda inst, text: inst.host.emit(inst, stream, text)


FUNCS: dict[str, Callable] = {name: func for funcs in host.INTERFACES.values() for name, func in funcs.items()}
FUNCS.update(stdout=_output("stdout"), stderr=_output("stderr"))


def apply_calls(inst, calls: list) -> object:
    """Apply ``calls`` ([name, args, expected] each) in order while ``inst`` lives; the last one's value.
    Raises what a host function raises, or ValueError for a call that is no host function's or
    whose value is not the one the runner gave the guest."""
    value = None
    for name, args, expected in calls:
        if not inst.alive:  # killed by one of them
            break
        func = FUNCS.get(name)
        if func is None:
            raise ValueError(f"the runner reported an unknown host call {name!r}")
        value = func(inst, *args)
        if expected is not None and value != expected:
            raise ValueError(f"{name}: the runner gave the guest {expected}, the host made {value}")
    return value
