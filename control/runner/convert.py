"""Component values between Python and wasmtime's C API, converted by functions compiled per type.

wasmtime-py converts a value by walking its type: every list element, record
field and result case re-derives the nested type from C, re-checks which
Python classes a case accepts, and sets each element through several ctypes
attribute writes. Host calls and ``resume`` run several times per generated
token, and that walk was the largest share of the control loop's CPU.

The types of our imports and exports never change, so :func:`lowerer` and
:func:`lifter` turn a type into a closure once, and a list of fixed-size scalars
(``list<u32>`` of tokens, pages, futures; ``list<f32>`` of probabilities) moves
in one ``memmove`` of a buffer laid out like C's ``wasmtime_component_val_t``
array. The values, the checks and the C memory ownership are wasmtime-py's:
the C side owns what a lowerer writes, and a lifter frees what it reads.
A lifted record is a dict of its fields (``forward-sample-shaped``'s shaping, which
carries a vocabulary-wide mask on every step). Types no hot call uses (tuple,
variant, enum, flags) fall back to wasmtime-py itself.
"""

from __future__ import annotations

import array
import ctypes
from collections.abc import Callable
from ctypes import byref
from typing import Any

from wasmtime import _ffi as ffi
from wasmtime.component import Variant
from wasmtime.component import _types as t

Lower = Callable[[Any, Any], None]  # (python value, wasmtime_component_val_t to fill)
Lift = Callable[[Any], Any]  # (wasmtime_component_val_t) -> python value, freeing what it held

_VAL = ffi.wasmtime_component_val_t
_VAL_SIZE = ctypes.sizeof(_VAL)
_ENTRY_SIZE = ctypes.sizeof(ffi.wasmtime_component_valrecord_entry_t)
_PAYLOAD = _VAL.of.offset
_LIST, _RECORD = ffi.WASMTIME_COMPONENT_LIST.value, ffi.WASMTIME_COMPONENT_RECORD.value
_RESULT, _OPTION = ffi.WASMTIME_COMPONENT_RESULT.value, ffi.WASMTIME_COMPONENT_OPTION.value
_STRING = ffi.WASMTIME_COMPONENT_STRING.value
_SHORT_LIST = 4  # up to here, setting elements one by one beats building and copying a buffer

# scalar type -> (C kind, union field, array typecode of the payload, Python check)
_SCALARS: dict[type, tuple[int, str, str, Callable[[Any], bool]]] = {}


def _int_range(lo: int, hi: int) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, int) and lo <= v <= hi


for _ty, _kind, _field, _code, _ok in [
    (t.Bool, ffi.WASMTIME_COMPONENT_BOOL, "boolean", "B", lambda v: isinstance(v, bool)),
    (t.S8, ffi.WASMTIME_COMPONENT_S8, "s8", "b", _int_range(-2**7, 2**7 - 1)),
    (t.U8, ffi.WASMTIME_COMPONENT_U8, "u8", "B", _int_range(0, 2**8 - 1)),
    (t.S16, ffi.WASMTIME_COMPONENT_S16, "s16", "h", _int_range(-2**15, 2**15 - 1)),
    (t.U16, ffi.WASMTIME_COMPONENT_U16, "u16", "H", _int_range(0, 2**16 - 1)),
    (t.S32, ffi.WASMTIME_COMPONENT_S32, "s32", "i", _int_range(-2**31, 2**31 - 1)),
    (t.U32, ffi.WASMTIME_COMPONENT_U32, "u32", "I", _int_range(0, 2**32 - 1)),
    (t.S64, ffi.WASMTIME_COMPONENT_S64, "s64", "q", _int_range(-2**63, 2**63 - 1)),
    (t.U64, ffi.WASMTIME_COMPONENT_U64, "u64", "Q", _int_range(0, 2**64 - 1)),
    (t.F32, ffi.WASMTIME_COMPONENT_F32, "f32", "f", lambda v: isinstance(v, float)),
    (t.F64, ffi.WASMTIME_COMPONENT_F64, "f64", "d", lambda v: isinstance(v, float)),
]:
    _SCALARS[_ty] = (_kind.value, _field, _code, _ok)


def lowerer(ty: t.ValType) -> Lower:
    """A function writing a Python value of ``ty`` into a ``wasmtime_component_val_t``."""
    if type(ty) in _SCALARS:
        return _lower_scalar(*_SCALARS[type(ty)])
    if isinstance(ty, t.String):
        return _lower_string
    if isinstance(ty, t.ListType):
        return _lower_list(ty.element)
    if isinstance(ty, t.RecordType):
        return _lower_record(ty.fields)
    if isinstance(ty, (t.ResultType, t.OptionType)):
        return _lower_variant_like(ty)
    return lambda value, dst: ty.convert_to_c(None, value, ctypes.pointer(dst))  # our WIT has no resources


def lifter(ty: t.ValType) -> Lift:
    """A function reading (and freeing) a ``wasmtime_component_val_t`` of ``ty`` as a Python value."""
    if type(ty) in _SCALARS:
        field = _SCALARS[type(ty)][1]
        if isinstance(ty, t.Bool):
            return lambda c: bool(c.of.boolean)
        return lambda c: getattr(c.of, field)
    if isinstance(ty, t.String):
        return _lift_string
    if isinstance(ty, t.ListType):
        return _lift_list(ty.element)
    if isinstance(ty, t.RecordType):
        return _lift_record(ty.fields)
    return ty.convert_from_c


# -- lowering ------------------------------------------------------------------


def _lower_scalar(kind: int, field: str, _code: str, ok: Callable[[Any], bool]) -> Lower:
    def lower(value, dst) -> None:
        if not ok(value):
            raise TypeError(f"expected a {field} value, got {value!r}")
        dst.kind = kind
        setattr(dst.of, field, value)
    return lower


def _lower_string(value, dst) -> None:
    if not isinstance(value, str):
        raise TypeError("expected string type")
    encoded = value.encode()
    ffi.wasm_byte_vec_new(byref(dst.of.string), len(encoded), _c_bytes(encoded))
    dst.kind = _STRING


def _lower_list(element: t.ValType) -> Lower:
    if type(element) in _SCALARS:
        return _lower_scalar_list(*_SCALARS[type(element)])
    lower_element = lowerer(element)

    def lower(value, dst) -> None:
        if not isinstance(value, list):
            raise TypeError("expected list value")
        raw = _new_list(dst, len(value))
        data = raw.data
        try:  # zeroed elements are `false`: deleting the list frees exactly what was written
            for i, item in enumerate(value):
                lower_element(item, data[i])
        except BaseException:
            ffi.wasmtime_component_vallist_delete(byref(raw))
            raise
        dst.kind = _LIST
    return lower


def _lower_scalar_list(kind: int, field: str, code: str, ok: Callable[[Any], bool]) -> Lower:
    """Short lists element by element; longer ones built in a bytearray laid out like the C array
    (a kind byte and a payload every 32 bytes) and copied at once."""
    width = array.array(code).itemsize
    offset, stride = _PAYLOAD // width, _VAL_SIZE // width
    kind_byte = bytes([kind])
    as_bytes = field == "u8"  # list<u8> is bytes in wasmtime-py

    def lower(value, dst) -> None:
        if as_bytes:
            if not isinstance(value, (bytes, bytearray)):
                raise TypeError("expected bytes value")
        elif not isinstance(value, list) or not all(map(ok, value)):
            raise TypeError(f"expected a list of {field} values")
        n = len(value)
        raw = _new_list(dst, n, zeroed=False)
        if n <= _SHORT_LIST:
            data = raw.data
            for i, v in enumerate(value):
                item = data[i]
                item.kind = kind
                setattr(item.of, field, v)
        else:
            buf = bytearray(n * _VAL_SIZE)
            buf[0::_VAL_SIZE] = kind_byte * n
            memoryview(buf).cast(code)[offset::stride] = array.array(code, value)
            ctypes.memmove(raw.data, bytes(buf), len(buf))
        dst.kind = _LIST
    return lower


def _new_list(dst, n: int, zeroed: bool = True):
    """A list of ``n`` elements allocated in place in ``dst``'s payload. ``dst.kind`` is the caller's
    to set once the elements are written; a caller that fails before that deletes the list itself."""
    raw = dst.of.list
    ffi.wasmtime_component_vallist_new_uninit(raw, n)
    if zeroed and n:
        ctypes.memset(raw.data, 0, n * _VAL_SIZE)
    return raw


def _lower_record(fields: list[tuple[str, t.ValType]]) -> Lower:
    compiled = [(_c_bytes(name.encode()), name, lowerer(ty)) for name, ty in fields]

    def lower(value, dst) -> None:
        raw = dst.of.record  # allocated in place, like _new_list
        ffi.wasmtime_component_valrecord_new_uninit(raw, len(compiled))
        data = raw.data
        if compiled:  # zeroed: empty names and `false` values, safe to delete at any point
            ctypes.memset(data, 0, len(compiled) * _ENTRY_SIZE)
        try:
            for i, (name, attr, lower_field) in enumerate(compiled):
                entry = data[i]
                lower_field(getattr(value, attr), entry.val)
                ffi.wasm_byte_vec_new(byref(entry.name), len(name), name)  # C copies the name
        except BaseException:
            ffi.wasmtime_component_valrecord_delete(byref(raw))
            raise
        dst.kind = _RECORD
    return lower


def _c_bytes(data: bytes):
    return (ctypes.c_uint8 * len(data)).from_buffer_copy(data)


def _lower_variant_like(ty) -> Lower:
    """result<ok, err> and option<some>: wasmtime-py's case selection, decided once per type."""
    is_result = isinstance(ty, t.ResultType)
    tagged = ty._tagged()
    cases = []  # (name, lower or None, classes that select the case when untagged)
    for name, case_ty in ty._cases():
        classes: set[type] = set()
        if case_ty is not None:
            case_ty.add_classes(classes)
        cases.append((name, lowerer(case_ty) if case_ty is not None else None, tuple(classes)))

    def choose(value):
        if tagged:
            if not isinstance(value, Variant):
                raise TypeError("expected Variant type")
            for name, lower, _ in cases:
                if name == value.tag:
                    return name, lower, value.payload
        else:
            for name, lower, classes in cases:
                if (lower is None and value is None) or (lower is not None and isinstance(value, classes)):
                    return name, lower, value
        raise ValueError("value not valid for this variant")

    def lower(value, dst) -> None:
        name, lower_case, payload = choose(value)
        boxed = None
        if lower_case is not None:
            tmp = _VAL()
            lower_case(payload, tmp)
            boxed = ffi.wasmtime_component_val_new(byref(tmp))
        if is_result:
            dst.kind = _RESULT
            result = dst.of.result
            result.is_ok = name == "ok"
            result.val = boxed
        else:
            dst.kind = _OPTION
            dst.of.option = boxed
    return lower


# -- lifting -------------------------------------------------------------------


def _lift_string(c) -> str:
    vec = c.of.string
    try:
        return ctypes.string_at(vec.data, vec.size).decode()
    finally:
        ffi.wasm_byte_vec_delete(byref(vec))


def _lift_record(fields: list[tuple[str, t.ValType]]) -> Lift:
    compiled = [(name, lifter(ty)) for name, ty in fields]

    def lift(c):
        raw = c.of.record
        try:
            values = {}
            for i, (name, lift_field) in enumerate(compiled):
                entry = raw.data[i].val
                values[name] = lift_field(entry)  # frees what the field owned...
                entry.kind = 0  # ...so the record's delete must see a plain `false` there
            return values
        finally:
            ffi.wasmtime_component_valrecord_delete(byref(raw))
    return lift


def _lift_list(element: t.ValType) -> Lift:
    if type(element) in _SCALARS:
        _, field, code, _ = _SCALARS[type(element)]
        width = array.array(code).itemsize
        offset, stride = _PAYLOAD // width, _VAL_SIZE // width
        as_bytes, as_bool = isinstance(element, t.U8), isinstance(element, t.Bool)

        def lift(c):
            raw = c.of.list
            try:  # scalars own no memory: read them without touching each element's kind
                n = raw.size
                if n <= _SHORT_LIST:
                    data = raw.data
                    values = [getattr(data[i].of, field) for i in range(n)]
                else:
                    values = memoryview(ctypes.string_at(raw.data, n * _VAL_SIZE)).cast(code)[offset::stride]
                return bytes(values) if as_bytes else [bool(v) for v in values] if as_bool else list(values)
            finally:
                ffi.wasmtime_component_vallist_delete(byref(raw))
        return lift
    lift_element = lifter(element)

    def lift(c):
        raw = c.of.list
        try:
            values = []
            for i in range(raw.size):
                item = raw.data[i]
                values.append(lift_element(item))  # frees what the element owned...
                item.kind = 0  # ...so the list's delete must see a plain `false` there
            return values
        finally:
            ffi.wasmtime_component_vallist_delete(byref(raw))
    return lift
