"""The ``oven:inferlet`` imports in a runner: each answered here, or recorded for the control process.

A function of :data:`LOCAL` runs here on the calling :class:`~.guest.Guest`. Every other function is
*forwarded*: the call goes into the guest's list of calls for the control process
(``Guest.forward``), and what the guest gets back at once depends on the call's ``reply``
(``proto.runner.CallSpec``): nothing, a new future's handle, a new queue id, or, for a call whose
value only the control process has, that value, asked for on the spot (``Guest.ask``).

A Python exception raised here becomes a trap that kills the calling instance only.
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

from oven.proto import runner as r

from . import local
from .convert import lifter, lowerer

PACKAGE = "oven:inferlet"
VERSION = "0.2.0"

LOCAL: dict[str, dict[str, Callable]] = local.INTERFACES


class WasmClock:
    """Wall time inside guest exports (``start``/``resume``) and inside the host calls they make.

    The difference is the inferlets' own code, which separates the host's work from the
    programs it runs. A slice never blocks (but on an ask), so wall time is CPU time here.
    """

    __slots__ = ("host_calls", "in_host_ns", "in_wasm_ns")

    def __init__(self) -> None:
        self.in_wasm_ns = self.in_host_ns = self.host_calls = 0

    @property
    def inferlet_code_s(self) -> float:
        return (self.in_wasm_ns - self.in_host_ns) / 1e9


def define_imports(linker, current: Callable[[], object], calls: list[r.CallSpec], clock: WasmClock) -> None:
    """Add every interface to a component ``linker``: :data:`LOCAL` functions and the forwarded
    ``calls``; ``current()`` is the guest running now (one thread runs one slice at a time)."""
    by_interface: dict[str, dict[str, Callable]] = {name: dict(funcs) for name, funcs in LOCAL.items()}
    for spec in calls:
        if spec.name not in by_interface.get(spec.interface, {}):
            by_interface.setdefault(spec.interface, {})[spec.name] = _forwarder(spec.name, spec.reply)
    with linker.root() as root:
        for interface, funcs in by_interface.items():
            with root.add_instance(f"{PACKAGE}/{interface}@{VERSION}") as inst:
                for name, func in funcs.items():
                    _add_func(inst, name, lambda *args, f=func: f(current(), *args), clock)


def _forwarder(name: str, reply: str) -> Callable:
    if name in ("forward-sample", "forward-sample-shaped"):  # input futures delivered here: pass their tokens
        return lambda guest, q, tokens, inputs, *rest: guest.forward(
            name, (q, *guest.known_tokens(tokens, inputs), *rest), guest.futures.create("").handle)
    if reply == r.REPLY_FUTURE:
        return lambda guest, *args: guest.forward(name, args, guest.futures.create("").handle)
    if reply == r.REPLY_QUEUE:
        return lambda guest, *args: guest.forward(name, args, guest.new_queue())
    if reply == r.REPLY_VALUE:
        return lambda guest, *args: guest.ask(name, args)
    return lambda guest, *args: guest.forward(name, args, None)


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
            _enter.LAST_EXCEPTION = exc  # enter_wasm re-raises it in the runner: the instance is killed
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
