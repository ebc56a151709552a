"""The compiled value converters of host calls against wasmtime-py's own conversion.

Every type a host call or guest export uses is declared in a small component;
each value is lowered by one side and lifted by the other, so both directions
must agree with wasmtime-py exactly (layout, case selection, ownership).
"""

from __future__ import annotations

import ctypes
import math
import re
from types import SimpleNamespace

import pytest
import wasmtime
from oven.control.runner.convert import lifter, lowerer
from wasmtime import _ffi as ffi
from wasmtime import component
from wasmtime.component import Record, Variant

WAT = """
(component
  (type $dist0 (record (field "token-ids" (list u32)) (field "probs" (list f32))))
  (import "distribution" (type $dist (eq $dist0)))
  (type $resp0 (record (field "status" u16) (field "body" (list u8))))
  (import "http-response" (type $resp (eq $resp0)))
  (type $f (func
    (param "u32" u32) (param "s32" s32) (param "u64" u64) (param "bool" bool) (param "f32" f32)
    (param "string" string)
    (param "list-u32" (list u32)) (param "list-f32" (list f32)) (param "list-bool" (list bool))
    (param "list-u8" (list u8)) (param "list-string" (list string)) (param "mask" (list (list u8)))
    (param "dist" $dist) (param "dists" (result (list $dist) (error string)))
    (param "unit" (result (error string))) (param "text" (result string (error string)))
    (param "handles" (result (list u32) (error string))) (param "http" (result $resp (error string)))
    (param "maybe" (option u32))))
  (import "f" (func (type $f)))
)
"""


@pytest.fixture(scope="module")
def types() -> dict:
    engine = wasmtime.Engine()
    func = component.Component(engine, WAT).type.imports(engine)["f"].ty
    return dict(func.params)


def dist(ids, probs):
    return SimpleNamespace(**{"token-ids": ids, "probs": probs})


def response(status, body):
    record = Record()
    record.status, record.body = status, body
    return record


CASES = [
    ("u32", 0), ("u32", 2**32 - 1), ("s32", -5), ("u64", 2**40), ("bool", True), ("f32", 0.5),
    ("string", ""), ("string", "héllo ✓"),
    ("list-u32", []), ("list-u32", [7]), ("list-u32", [0, 1, 2**32 - 1, 12345]),
    ("list-u32", [2**32 - 1 - i * 7919 for i in range(50)]),  # long lists take the buffer path
    ("list-f32", [0.25, -1.5, 3.0]), ("list-f32", [i / 8 for i in range(-20, 20)]),
    ("list-bool", [True, False, True]), ("list-bool", [i % 3 == 0 for i in range(11)]),
    ("list-u8", b"\x00\x01\xff"), ("list-u8", bytes(range(256))),
    ("list-u8", b""), ("list-string", ["a", "", "ü"]), ("mask", [b"\x01\x00", b"", b"\x01"]),
    ("dist", dist([3, 4], [0.5, 0.25])),
    ("dists", [dist([1], [1.0]), dist([2, 9], [0.75, 0.125])]), ("dists", []), ("dists", "bad page"),
    ("unit", None), ("unit", "freed"), ("text", Variant("ok", "hi")), ("text", Variant("err", "no")),
    ("handles", [4, 5]), ("handles", "quota"), ("http", response(200, b"ok")), ("http", "denied"),
    ("maybe", None), ("maybe", 3),
]


def plain(value):
    """A comparable form of a lifted value (records become dicts, floats stay exact)."""
    if isinstance(value, (Record, SimpleNamespace)):
        return {k: plain(v) for k, v in sorted(vars(value).items())}
    if isinstance(value, Variant):
        return ("variant", value.tag, plain(value.payload))
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def lower_ours(ty, value):
    val = ffi.wasmtime_component_val_t()
    lowerer(ty)(value, val)
    return val


def lower_theirs(ty, value):
    val = ffi.wasmtime_component_val_t()
    ty.convert_to_c(None, value, ctypes.pointer(val))
    return val


@pytest.mark.parametrize("name,value", CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_our_lowering_reads_back_in_wasmtime_py(types, name, value):
    ty = types[name]
    assert plain(ty.convert_from_c(lower_ours(ty, value))) == plain(value)


@pytest.mark.parametrize("name,value", CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_our_lifting_reads_wasmtime_py_lowering(types, name, value):
    ty = types[name]
    assert plain(lifter(ty)(lower_theirs(ty, value))) == plain(value)


def test_round_trip_through_our_own_converters(types):
    for name, value in CASES:
        ty = types[name]
        assert plain(lifter(ty)(lower_ours(ty, value))) == plain(value), name


def test_f32_lists_round_to_single_precision(types):
    ty = types["list-f32"]
    assert lifter(ty)(lower_ours(ty, [0.1, math.pi])) == [ctypes.c_float(0.1).value, ctypes.c_float(math.pi).value]


@pytest.mark.parametrize("name, value, error", [
    ("u32", -1, "expected a u32 value, got -1"), ("u32", 2**32, "expected a u32 value, got 4294967296"),
    ("u32", "7", "expected a u32 value, got '7'"), ("bool", 1, "expected a boolean value, got 1"),
    ("f32", "x", "expected a f32 value, got 'x'"), ("string", b"bytes", "expected string type"),
    ("list-u32", [1, -2], "expected a list of u32 values"), ("list-u32", [1, 2**32], "expected a list of u32 values"),
    ("list-u32", (1, 2), "expected a list of u32 values"), ("list-u32", [1.0], "expected a list of u32 values"),
    ("list-u8", [1, 2], "expected bytes value"), ("list-string", ["a", 3], "expected string type"),
    ("dists", [dist([1], ["p"])], "expected a list of f32 values"), ("dists", 5, "value not valid for this variant"),
    ("handles", [1, "2"], "expected a list of u32 values"), ("text", "untagged", "expected Variant type"),
    ("maybe", "3", "value not valid for this variant"),
])
def test_bad_values_raise_and_leave_nothing_half_written(types, name, value, error):
    val = ffi.wasmtime_component_val_t()
    with pytest.raises((TypeError, ValueError), match=f"^{re.escape(error)}$"):
        lowerer(types[name])(value, val)
    assert val.kind == 0  # untouched: nothing for the caller to free
