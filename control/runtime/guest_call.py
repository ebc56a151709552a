"""Calling a guest export without rebuilding its type on every call.

wasmtime-py's ``component.Func.__call__`` asks C for the function's type (and
every nested list type) on each call; ``resume`` runs once per token per
instance, so :class:`GuestExport` reads the types once and keeps them, then
performs the same lowering, call and lifting as wasmtime-py.
"""

from __future__ import annotations

from ctypes import byref, pointer
from typing import Any

from wasmtime import _ffi as ffi
from wasmtime.component import Func
from wasmtime.component._enter import enter_wasm

from .host.fast_types import memoise


class GuestExport:
    def __init__(self, func: Func, store):
        self.func, self.store = func, store
        fty = func.type(store)
        self.param_types = [memoise(ty) for _, ty in fty.params]
        self.result_type = memoise(fty.result)

    def __call__(self, *params: Any) -> Any:
        """Call, then run the guest's post-return; raises wasmtime.WasmtimeError/Trap like Func."""
        if len(params) != len(self.param_types):
            raise TypeError(f"expected {len(self.param_types)} arguments, got {len(params)}")
        lowered = (ffi.wasmtime_component_val_t * len(params))()
        num_lowered = 0
        try:
            for ty, value in zip(self.param_types, params):
                ty.convert_to_c(self.store, value, pointer(lowered[num_lowered]))
                num_lowered += 1
            result = ffi.wasmtime_component_val_t() if self.result_type is not None else None
            func, context = self.func._func, self.store._context()
            enter_wasm(lambda: ffi.wasmtime_component_func_call(
                byref(func), context, lowered, num_lowered,
                byref(result) if result is not None else None, 1 if result is not None else 0))
            value = self.result_type.convert_from_c(result) if result is not None else None
        finally:
            for i in range(num_lowered):
                ffi.wasmtime_component_val_delete(byref(lowered[i]))
        self.func.post_return(self.store)
        return value
