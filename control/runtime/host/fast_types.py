"""Memoised wasmtime-py component types, for host calls on the hot path.

wasmtime-py derives a list's element type, a record's fields and a variant's
cases from C again each time a value is converted (several times per value),
and decides again whether a result needs an explicit tag. The types of our
imports never change, so :func:`memoise` swaps each type object of a function
signature for a subclass that computes those once. Only derived, immutable
type information is cached; values are converted by wasmtime-py as before.
"""

from __future__ import annotations

from wasmtime.component._types import ListType, OptionType, RecordType, ResultType, ValType, VariantType


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
