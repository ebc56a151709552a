"""Host imports of the ``oven:inferlet`` WIT world, one module per interface.

Each module maps WIT function names to plain functions whose first argument is
the calling :class:`~oven.control.runtime.instance.Instance`. A Python
exception raised here becomes a trap that kills the calling instance only; an
error the inferlet may handle travels back in a future or a ``result``.
"""

from __future__ import annotations

from typing import Callable

from . import embeds, forward, futures, http, kvpages, messaging, queues, runtime, tokenize

PACKAGE = "oven:inferlet"
VERSION = "0.1.0"

INTERFACES: dict[str, dict[str, Callable]] = {
    "futures": futures.FUNCS,
    "runtime": runtime.FUNCS,
    "messaging": messaging.FUNCS,
    "http": http.FUNCS,
    "queues": queues.FUNCS,
    "kvpages": kvpages.FUNCS,
    "embeds": embeds.FUNCS,
    "forward": forward.FUNCS,
    "tokenize": tokenize.FUNCS,
}


def define_imports(linker, current: Callable[[], object]) -> None:
    """Add every interface to a component ``linker``; ``current()`` is the instance running now.

    One host thread runs one instance at a time, so the caller of a host
    function is always the instance the loop last resumed.
    """
    with linker.root() as root:
        for interface, funcs in INTERFACES.items():
            with root.add_instance(f"{PACKAGE}/{interface}@{VERSION}") as inst:
                for name, func in funcs.items():
                    inst.add_func(name, lambda _store, *args, f=func: f(current(), *args))
