"""Host imports of the ``oven:inferlet`` WIT world, one module per interface.

Each module maps WIT function names to plain functions whose first argument is
the calling :class:`~oven.control.runtime.instance.Instance`; beyond that
instance they use only its ``host`` (:class:`~oven.control.runtime.services.HostServices`).
A Python exception raised here becomes a trap that kills the calling instance
only; an error the inferlet may handle travels back in a future or a ``result``.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from time import perf_counter_ns

from wasmtime import WasmtimeError
from wasmtime import _ffi as ffi
from wasmtime.component import _enter
from wasmtime.component._enter import catch_exceptions
from wasmtime.component._types import FuncType

from . import (
    adapters,
    embeds,
    forward,
    futures,
    http,
    kvpages,
    messaging,
    queues,
    runtime,
    tokenize,
)
from .convert import lifter, lowerer

PACKAGE = "oven:inferlet"
VERSION = "0.2.0"

INTERFACES: dict[str, dict[str, Callable]] = {
    "futures": futures.FUNCS,
    "runtime": runtime.FUNCS,
    "messaging": messaging.FUNCS,
    "http": http.FUNCS,
    "queues": queues.FUNCS,
    "kvpages": kvpages.FUNCS,
    "embeds": embeds.FUNCS,
    "adapters": adapters.FUNCS,
    "forward": forward.FUNCS,
    "tokenize": tokenize.FUNCS,
}


class WasmClock:
    """Wall time inside guest exports (``start``/``resume``) and inside the host calls they make.

    The difference is the inferlets' own code, which separates the control
    layer's CPU from the programs it runs. A slice never blocks, so wall time
    is CPU time here.
    """

    __slots__ = ("host_calls", "in_host_ns", "in_wasm_ns")

    def __init__(self) -> None:
        self.in_wasm_ns = self.in_host_ns = self.host_calls = 0

    @property
    def inferlet_code_s(self) -> float:
        return (self.in_wasm_ns - self.in_host_ns) / 1e9


def define_imports(linker, current: Callable[[], object], clock: WasmClock) -> None:
    """Add every interface to a component ``linker``; ``current()`` is the instance running now.

    One host thread runs one instance at a time, so the caller of a host
    function is always the instance the loop last resumed.
    """
    with linker.root() as root:
        for interface, funcs in INTERFACES.items():
            with root.add_instance(f"{PACKAGE}/{interface}@{VERSION}") as inst:
                for name, func in funcs.items():
                    _add_func(inst, name, lambda *args, f=func: f(current(), *args), clock)


# wasmtime-py's own LinkerInstance.add_func rebuilds the function's type (params,
# result, every nested list/record type) from C on every call, about 60-90 us
# of a ~100 us host call (bench/README.md). The types of an import never change,
# so this trampoline compiles their converters (convert.py) once per function.
_HOST_FUNCS: list[list] = []  # [python function, WasmClock, (param lifters, result lowerer or None) or None]


@ffi.wasmtime_component_func_callback_t
def _trampoline(index, context, ty_raw, args, nargs, results, nresults):  # noqa: ANN001 (C callback)
    entry = _HOST_FUNCS[index or 0]  # ctypes passes a void* of 0 as None
    if entry[2] is None:  # first call: compile the converters from the type this call lends us
        error = catch_exceptions(context, lambda store: _compile(entry, ty_raw, store))
        if error:
            return error
    start = perf_counter_ns()
    try:
        lifts, lower = entry[2]
        value = entry[0](*[lift(args[i]) for i, lift in enumerate(lifts)])
        if lower is not None:
            lower(value, results[0])
        return 0
    except Exception as exc:  # what wasmtime-py's catch_exceptions does, without a StoreContext per call
        if not isinstance(exc, WasmtimeError):
            _enter.LAST_EXCEPTION = exc  # enter_wasm re-raises it in the loop: the instance is killed
            exc = WasmtimeError("python exception")
        return ctypes.cast(exc._consume(), ctypes.c_void_p).value
    finally:
        clock = entry[1]
        clock.in_host_ns += perf_counter_ns() - start
        clock.host_calls += 1


def _compile(entry: list, ty_raw, store) -> None:
    fty = FuncType._from_ptr(ty_raw, owner=store)
    entry[2] = ([lifter(ty) for _, ty in fty.params], lowerer(fty.result) if fty.result else None)


@ctypes.CFUNCTYPE(None, ctypes.c_void_p)
def _finalize(_index) -> None:  # host functions live as long as the process
    return None


def _add_func(linker_instance, name: str, func: Callable, clock: WasmClock) -> None:
    _HOST_FUNCS.append([func, clock, None])
    encoded = name.encode()
    error = ffi.wasmtime_component_linker_instance_add_func(
        linker_instance.ptr(), ctypes.create_string_buffer(encoded), len(encoded), _trampoline,
        len(_HOST_FUNCS) - 1, _finalize)
    if error:
        raise WasmtimeError._from_ptr(error)
