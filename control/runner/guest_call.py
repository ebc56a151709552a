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

from .imports import WasmClock
from .convert import lifter, lowerer


class GuestExport:
    def __init__(self, func: Func, store, clock: WasmClock):
        self.clock = clock
        fty = func.type(store)
        self.lowers = [lowerer(ty) for _, ty in fty.params]
        self.lift = lifter(fty.result) if fty.result is not None else None
        # Kept for the store's lifetime: the C function and context, and the argument and result
        # slots (a call never re-enters its instance, and each call frees what it wrote there).
        self._func, self._context, self._keep = byref(func._func), store._context(), (func, store)
        self._params = (ffi.wasmtime_component_val_t * len(self.lowers))()
        self._result = ffi.wasmtime_component_val_t() if self.lift is not None else None

    def __call__(self, *params: Any) -> Any:
        """Call, then run the guest's post-return; raises wasmtime.WasmtimeError/Trap like Func."""
        if len(params) != len(self.lowers):
            raise TypeError(f"expected {len(self.lowers)} arguments, got {len(params)}")
        lowered, result = self._params, self._result
        num_lowered = 0
        try:
            for lower, value in zip(self.lowers, params):
                lower(value, lowered[num_lowered])
                num_lowered += 1
            start = perf_counter_ns()
            error = ffi.wasmtime_component_func_call(self._func, self._context, lowered, num_lowered,
                                                     byref(result) if result is not None else None,
                                                     0 if result is None else 1)
            self.clock.in_wasm_ns += perf_counter_ns() - start
            enter_wasm(lambda: error)  # raises what wasmtime-py raises (a host function's own error first)
            value = self.lift(result) if result is not None else None
            enter_wasm(lambda: ffi.wasmtime_component_func_post_return(self._func, self._context))
            return value
        except BaseException as exc:
            # The raising frames keep the error in a local (a cycle through the traceback),
            # which would keep this store alive until a full collection.
            traceback.clear_frames(exc.__traceback__)
            raise
        finally:
            for i in range(num_lowered):
                ffi.wasmtime_component_val_delete(byref(lowered[i]))
