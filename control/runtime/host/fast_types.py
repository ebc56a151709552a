"""Memoised wasmtime-py component types, for host calls on the hot path.

wasmtime-py derives a list's element type, a record's fields and a variant's
cases from C again each time a value is converted (several times per value),
and decides again whether a result needs an explicit tag. The types of our
imports never change, so :func:`memoise` swaps each type object of a function
signature for a subclass that computes those once. Only derived, immutable
type information is cached; values are converted by wasmtime-py as before.
"""

from __future__ import annotations

from ctypes import byref

from wasmtime import _ffi as ffi
from wasmtime.component._types import (
    U32,
    ListType,
    OptionType,
    RecordType,
    ResultType,
    ValType,
    VariantType,
)


def _cached(obj, key: str, compute):
    cache = obj.__dict__.setdefault("_oven_cache", {})
    if key not in cache:
        cache[key] = compute()
    return cache[key]


class _List(ListType):
    @property
    def element(self) -> ValType:
        return _cached(self, "element", lambda: memoise(ListType.element.fget(self)))

    def _is_bytes(self) -> bool:
        return _cached(self, "is_bytes", lambda: ListType._is_bytes(self))

    def _is_u32(self) -> bool:
        return _cached(self, "is_u32", lambda: isinstance(self.element, U32))

    # list<u32> (token ids, handles, futures) is on every hot call: convert it in one loop
    # instead of one ValType dispatch per element. Same checks and memory handling as wasmtime-py.
    def convert_from_c(self, c):
        if not self._is_u32():
            return ListType.convert_from_c(self, c)
        try:
            data = c.of.tuple.data
            return [data[i].of.u32 for i in range(c.of.record.size)]
        finally:
            ffi.wasmtime_component_valtuple_delete(byref(c.of.tuple))

    def convert_to_c(self, store, val, ptr) -> None:
        if not self._is_u32():
            return ListType.convert_to_c(self, store, val, ptr)
        if not isinstance(val, list) or not all(type(v) is int and 0 <= v <= 0xFFFFFFFF for v in val):
            raise TypeError("expected a list of u32 values")
        raw = ffi.wasmtime_component_vallist_t()
        ffi.wasmtime_component_vallist_new_uninit(raw, len(val))
        kind = ffi.WASMTIME_COMPONENT_U32
        for i, v in enumerate(val):
            element = raw.data[i]
            element.kind = kind
            element.of.u32 = v
        ptr.contents.kind = ffi.WASMTIME_COMPONENT_LIST
        ptr.contents.of.list = raw


class _Record(RecordType):
    @property
    def fields(self):
        return _cached(self, "fields", lambda: [(n, memoise(t)) for n, t in RecordType.fields.fget(self)])


def _memoised_cases(base):
    class Memoised(base):
        def _cases(self):
            return _cached(self, "cases", lambda: [(n, memoise(t) if t is not None else None)
                                                   for n, t in base._cases(self)])

        def _tagged(self) -> bool:
            return _cached(self, "tagged", lambda: base._tagged(self))
    Memoised.__name__ = f"Memoised{base.__name__}"
    return Memoised


_SUBCLASS = {
    ListType: _List,
    RecordType: _Record,
    ResultType: _memoised_cases(ResultType),
    OptionType: _memoised_cases(OptionType),
    VariantType: _memoised_cases(VariantType),
}


def memoise(ty: ValType | None) -> ValType | None:
    """The same type object, its class switched to the memoising subclass where there is one."""
    if ty is not None and type(ty) in _SUBCLASS:
        ty.__class__ = _SUBCLASS[type(ty)]
    return ty
