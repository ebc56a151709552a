"""Calling a guest export without rebuilding its type on every call.

wasmtime-py's ``component.Func.__call__`` asks C for the function's type (and
every nested list type) on each call; ``resume`` runs once per token per
instance, so :class:`GuestExport` compiles the converters of its types once
(``host/convert.py``), then lowers, calls and lifts as wasmtime-py does.
"""

from __future__ import annotations

import traceback
from ctypes import byref
from time import perf_counter_ns
from typing import Any

from wasmtime import _ffi as ffi
from wasmtime.component import Func
from wasmtime.component._enter import enter_wasm

from .host import WasmClock
from .host.convert import lifter, lowerer


class GuestExport:
    def __init__(self, func: Func, store, clock: WasmClock):
        self.func, self.store, self.clock = func, store, clock
        fty = func.type(store)
        self.lowers = [lowerer(ty) for _, ty in fty.params]
        self.lift = lifter(fty.result) if fty.result is not None else None

    def __call__(self, *params: Any) -> Any:
        """Call, then run the guest's post-return; raises wasmtime.WasmtimeError/Trap like Func."""
        if len(params) != len(self.lowers):
            raise TypeError(f"expected {len(self.lowers)} arguments, got {len(params)}")
        lowered = (ffi.wasmtime_component_val_t * len(params))()
        num_lowered = 0
        try:
            for lower, value in zip(self.lowers, params):
                lower(self.store, value, lowered[num_lowered])
                num_lowered += 1
            result = ffi.wasmtime_component_val_t() if self.lift is not None else None
            func, context, clock = self.func._func, self.store._context(), self.clock

            def call():
                start = perf_counter_ns()
                try:
                    return ffi.wasmtime_component_func_call(
                        byref(func), context, lowered, num_lowered,
                        byref(result) if result is not None else None, 1 if result is not None else 0)
                finally:
                    clock.in_wasm_ns += perf_counter_ns() - start
            try:
                enter_wasm(call)
            except BaseException as exc:
                # wasmtime-py raises from a frame that keeps the error in a local (a cycle through
                # the traceback), which would keep this store alive until a full collection.
                traceback.clear_frames(exc.__traceback__)
                raise
            value = self.lift(result) if result is not None else None
        finally:
            for i in range(num_lowered):
                ffi.wasmtime_component_val_delete(byref(lowered[i]))
        self.func.post_return(self.store)
        return value
