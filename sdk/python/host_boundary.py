"""Every host function checked at the boundary: a wrong argument type raises TypeError in the guest.

componentize-py lowers each argument to its WIT type in native code; a value it cannot lower (a float
for a u32, a number for a string) panics there, and the panic traps the whole component: the instance
dies with an opaque ``unreachable`` instead of an exception it could catch. ``check_imports()`` wraps each
function of ``wit_world.imports`` once, in place, with a check built from its binding's annotations, so
both SDK layers (``inferlet`` and ``oven_inferlet``) and an app's own raw calls are covered. Imports run
when componentize-py builds the component, so the wrapping costs nothing at an instance's start.

Checked: the type of each argument, elements of lists, fields of records, enum members. A tuple where
the WIT has a list is converted (lowering takes lists only). Not checked: integer ranges (the bindings
say ``int`` for every width; a negative or too large value still traps).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import importlib
import inspect
import typing

# The WIT's imported interfaces (a guest cannot list its own bundled modules: pkgutil finds none);
# test_runtime's bad-types test fails when one is missing.
INTERFACES = ("adapters", "children", "embeds", "forward", "futures", "grammars", "http", "kvpages", "messaging",
              "queues", "runtime", "tokenize")
_WRAPPED = "__oven_checked__"


def _describe(hint) -> str:
    origin = typing.get_origin(hint)
    if origin is list:
        return f"a list of {_describe(typing.get_args(hint)[0])}"
    if origin is typing.Union:
        return " or ".join("None" if a is type(None) else _describe(a) for a in typing.get_args(hint))
    return getattr(hint, "__name__", str(hint))


def _checker(hint):
    """A function of a value that returns it (a tuple as a list) when it lowers to ``hint``, else raises
    TypeError; None for a hint it does not know (left to the lowering)."""
    origin = typing.get_origin(hint)
    if hint is bool:
        return lambda v: v if v.__class__ is bool else _wrong(v, hint)
    if hint is int:
        return lambda v: v if isinstance(v, int) and v.__class__ is not bool else _wrong(v, hint)
    if hint is float:
        return lambda v: v if isinstance(v, (int, float)) and v.__class__ is not bool else _wrong(v, hint)
    if hint is str:
        return lambda v: v if isinstance(v, str) else _wrong(v, hint)
    if hint is bytes:
        return lambda v: v if isinstance(v, (bytes, bytearray)) else _wrong(v, hint)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return lambda v: v if isinstance(v, hint) else _wrong(v, hint)
    if origin is list:
        item = _checker(typing.get_args(hint)[0])
        fast = {int: int, str: str, bool: bool}.get(typing.get_args(hint)[0])

        def check_list(v):
            if v.__class__ is tuple:
                v = list(v)
            elif not isinstance(v, list):
                _wrong(v, hint)
            # The common case (a list of token ids) in one pass, with no call per element.
            if item is not None and not (fast is not None and all(x.__class__ is fast for x in v)):
                for x in v:
                    item(x)
            return v
        return check_list
    if origin is typing.Union:
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        inner = _checker(options[0]) if len(options) == 1 else None
        return lambda v: v if v is None or inner is None else inner(v)
    if dataclasses.is_dataclass(hint):
        fields = [(f.name, _checker(t)) for f, t in zip(dataclasses.fields(hint), typing.get_type_hints(hint).values())]

        def check_record(v):
            if not isinstance(v, hint):
                _wrong(v, hint)
            for name, check in fields:
                if check is not None:
                    try:
                        check(getattr(v, name))
                    except TypeError as exc:
                        raise TypeError(f"field {name}: {exc}") from None
            return v
        return check_record
    return None


def _wrong(value, hint):
    raise TypeError(f"expected {_describe(hint)}, not {type(value).__name__} {value!r:.40}")


_SCALARS = {int: (int,), bool: (bool,), float: (int, float), str: (str,), bytes: (bytes,)}


def _fast(hint, var: str, names: dict) -> str:
    """A Python expression, true when ``var`` certainly lowers to ``hint`` as it is: exact classes only, so
    the common call passes in one generated frame; anything else (an int subclass, a tuple for a list, a
    wrong type) goes to the full check, which converts or raises."""
    def name(value) -> str:
        names[f"_c{len(names)}"] = value
        return f"_c{len(names) - 1}"
    origin = typing.get_origin(hint)
    if hint in _SCALARS:
        return "(" + " or ".join(f"{var}.__class__ is {name(c)}" for c in _SCALARS[hint]) + ")"
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return f"{var}.__class__ is {name(hint)}"
    if origin is list:
        (item,) = typing.get_args(hint)
        classes = _SCALARS.get(item) or ((item,) if isinstance(item, type) else None)
        if classes is None:
            return "False"
        # set(map(type, v)): the element check in C, no Python call per element (token lists are long).
        return f"({var}.__class__ is {name(list)} and {name(set)}({name(map)}({name(type)}, {var})) <= {name(set(classes))})"
    if origin is typing.Union:
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        return f"({var} is None or {_fast(options[0], var, names)})" if len(options) == 1 else "False"
    if dataclasses.is_dataclass(hint):
        fields = [_fast(t, f"{var}.{f.name}", names)
                  for f, t in zip(dataclasses.fields(hint), typing.get_type_hints(hint).values())]
        return f"({var}.__class__ is {name(hint)} and " + " and ".join(fields) + ")"
    return "False"


def _wrap(module_name: str, function):
    params = list(inspect.signature(function).parameters)
    hints = typing.get_type_hints(function)
    checks = [(name, _checker(hints[name]) if name in hints else None) for name in params]
    where = f"{module_name}.{function.__name__}"
    names: dict = {}
    arguments = [f"a{i}" for i in range(len(params))]
    test = " and ".join(_fast(hints.get(p), a, names) if p in hints else "True" for p, a in zip(params, arguments))
    exec(f"def fast({', '.join(arguments)}):\n    return {test or 'True'}", names)
    fast = names["fast"]

    def lowered(args):
        if len(args) != len(checks):
            raise TypeError(f"{where} takes {len(checks)} arguments, not {len(args)}")
        out = list(args)
        for i, (name, check) in enumerate(checks):
            if check is not None:
                try:
                    out[i] = check(args[i])
                except TypeError as exc:
                    raise TypeError(f"{where}: {name}: {exc}") from None
        return out

    @functools.wraps(function)
    def checked(*args):
        if len(args) == len(checks) and fast(*args):
            return function(*args)
        return function(*lowered(args))
    setattr(checked, _WRAPPED, True)
    return checked


def check_imports() -> None:
    """Wrap every host function once (a second call finds them wrapped)."""
    for interface in INTERFACES:
        module = importlib.import_module(f"wit_world.imports.{interface}")
        for name, value in list(vars(module).items()):
            if inspect.isfunction(value) and value.__module__ == module.__name__ and not getattr(value, _WRAPPED, False):
                setattr(module, name, _wrap(interface, value))
