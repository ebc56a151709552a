"""One msgpack codec for every typed message that crosses a process boundary.

A message is a frozen dataclass registered under a short tag. On the wire an
envelope is the msgpack array ``[protocol_version, tag, request_id, body]`` where
``body`` lists the dataclass fields in declaration order (nested dataclasses the
same way). Decoding checks every field against its type hint, so a malformed
message from a peer becomes a :class:`ProtocolError` with a precise path
(``ForwardRequest.items[3].kv_page_ids[0]: expected int, got str``) instead of a
crash somewhere deep in a handler.

Every batch request and reply of the control loop passes through here, so
walking type hints per message showed up in its profile. ``Codec`` therefore
compiles each class's hints once, at construction, into small closures: a
decoder that only accepts or rejects (no paths, no hint lookups), and an
encoder that knows which fields hold dataclasses. When the compiled decoder
rejects a body, the hint walker decodes it again to name the problem (and has
the last word). The two paths accept the same messages and build equal ones;
the encoder's output is byte-identical to the walker's.
"""

from __future__ import annotations

import dataclasses
import inspect
import io
import operator
import types
import typing
from collections.abc import Callable
from typing import Any, Union

import msgpack

__all__ = ["ProtocolError", "Codec", "Envelope"]


class ProtocolError(ValueError):
    """A message could not be decoded: wrong version, unknown tag or a bad field."""


class _Reject(Exception):
    """A compiled decoder met something it does not accept; the hint walker says what."""


@dataclasses.dataclass(frozen=True, slots=True)
class Envelope:
    request_id: int
    message: Any


_MAX_U64 = 2**64 - 1
_EXACT = (int, bool, str, bytes)  # a wire value of exactly this type is the field value
_SCALARS = (int, float, bytes, str)  # _to_wire sends a list starting with one of these as it is


class Codec:
    """Encodes and decodes the dataclasses registered with it.

    ``messages`` maps wire tag -> dataclass. The tag table is the whole
    vocabulary of a channel; anything else is rejected on decode.
    """

    def __init__(self, version: int, messages: dict[str, type]):
        self.version = version
        self._class_by_tag = dict(messages)
        self._tag_by_class = {cls: tag for tag, cls in messages.items()}
        self._hints: dict[type, list[tuple[str, Any]]] = {}
        for cls in messages.values():
            self._collect_hints(cls)
        # The hot path, compiled once from the hints (see the module docstring).
        self._decoders: dict[type, Callable[[Any], Any]] = {}
        self._encoders: dict[type, Callable[[Any], Any]] = {}
        for cls in messages.values():
            self._dataclass_decoder(cls)
            self._dataclass_encoder(cls)

    def tag(self, cls: type) -> str:
        """The wire tag ``cls`` is registered under (KeyError for a class that is not)."""
        return self._tag_by_class[cls]

    # -- encoding ---------------------------------------------------------

    def encode(self, message: Any, request_id: int = 0) -> bytes:
        tag = self._tag_by_class.get(type(message))
        if tag is None:
            raise TypeError(f"{type(message).__name__} is not a registered message")
        body = self._encoders[type(message)](message)
        try:
            return msgpack.packb([self.version, tag, request_id, body], use_bin_type=True)
        except TypeError:
            # Fields without a dataclass in their hint go out as they are; if one held
            # something else (a dataclass where an int belongs), the walker encodes it as
            # it always has, or raises as it always did.
            return msgpack.packb([self.version, tag, request_id, _to_wire(message)], use_bin_type=True)

    # -- decoding ---------------------------------------------------------

    def decode(self, payload: bytes) -> Envelope:
        try:
            raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
        except Exception as exc:  # msgpack raises several unrelated types
            raise ProtocolError(f"not a msgpack message: {exc}") from None
        if not isinstance(raw, list) or len(raw) != 4:
            raise ProtocolError("envelope must be [version, tag, request_id, body]")
        version, tag, request_id, body = raw
        if version != self.version:
            raise ProtocolError(f"protocol version {version!r} is not supported (expected {self.version})")
        if not isinstance(request_id, int) or isinstance(request_id, bool) or not 0 <= request_id <= _MAX_U64:
            raise ProtocolError("request_id must be an unsigned 64-bit integer")
        cls = self._class_by_tag.get(tag) if isinstance(tag, str) else None
        if cls is None:
            raise ProtocolError(f"unknown message tag {tag!r}")
        try:
            message = self._decoders[cls](body)
        except _Reject:
            message = self._from_wire(body, cls, cls.__name__)
        return Envelope(request_id, message)

    def peek_list_length(self, payload: bytes, field: str) -> tuple[int, type, int] | None:
        """(request_id, message class, length of its list field ``field``), read from the head of
        ``payload`` without decoding the rest; None when the head is not a well-formed envelope of a
        class with that field (:meth:`decode` then says what is wrong). A server can refuse an oversize
        batch this way before paying for its items (2M items take seconds to decode)."""
        try:
            # From a stream, the unpacker reads only as far as asked (16 KiB at a time), not the body.
            unpacker = msgpack.Unpacker(io.BytesIO(payload), raw=False, strict_map_key=False)
            if unpacker.read_array_header() != 4:
                return None
            version, tag, request_id = unpacker.unpack(), unpacker.unpack(), unpacker.unpack()
            cls = self._class_by_tag.get(tag) if isinstance(tag, str) else None
            if version != self.version or cls is None or type(request_id) is not int:
                return None
            if not 0 <= request_id <= _MAX_U64:
                return None
            names = [name for name, _ in self._hints[cls]]
            if field not in names or unpacker.read_array_header() != len(names):
                return None
            for _ in range(names.index(field)):
                unpacker.skip()
            return request_id, cls, unpacker.read_array_header()
        except Exception:  # msgpack raises several unrelated types; decode names the fault
            return None

    def peek_request_id(self, payload: bytes) -> int:
        """Best-effort request id of a message that failed to decode (0 if none)."""
        try:
            raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
            rid = raw[2]
            return rid if isinstance(rid, int) and 0 <= rid <= _MAX_U64 else 0
        except Exception:
            return 0

    def _collect_hints(self, cls: type) -> None:
        if cls in self._hints:
            return
        hints = typing.get_type_hints(cls)
        fields = [(f.name, hints[f.name]) for f in dataclasses.fields(cls)]
        self._hints[cls] = fields
        for _, hint in fields:
            for inner in _walk(hint):
                if dataclasses.is_dataclass(inner):
                    self._collect_hints(inner)

    # -- compiled paths ---------------------------------------------------

    def _dataclass_decoder(self, cls: type):
        """cls's wire array -> instance, built positionally; raises _Reject on anything off its hints."""
        return _compiled(self._decoders, cls, self._build_decoder)

    def _build_decoder(self, cls: type):
        fields = self._hints[cls]
        n = len(fields)
        make = _constructor(cls, [name for name, _ in fields])
        exact = [(i, hint) for i, (_, hint) in enumerate(fields) if hint in _EXACT]
        convert = [(i, self._decoder(hint)) for i, (_, hint) in enumerate(fields) if hint not in _EXACT]
        if not convert:  # only ints, bools, strs and bytes: one comparison checks every field
            types_ = tuple(hint for _, hint in fields)

            def decode(value):
                if type(value) is not list or tuple(map(type, value)) != types_:
                    raise _Reject
                return make(*value)
        else:
            def decode(value):
                if type(value) is not list or len(value) != n:
                    raise _Reject
                for i, t in exact:
                    if type(value[i]) is not t:
                        raise _Reject
                args = value.copy()
                for i, dec in convert:
                    args[i] = dec(args[i])
                return make(*args)
        return decode

    def _decoder(self, hint: Any):
        """``hint`` compiled to wire value -> value, raising _Reject wherever _from_wire would raise
        (and always for a hint not compiled here, say another union, so the walker decides)."""
        if dataclasses.is_dataclass(hint):
            return self._dataclass_decoder(hint)
        if hint in _EXACT:
            def decode_exact(value):
                if type(value) is not hint:
                    raise _Reject
                return value
            return decode_exact
        if hint is float:
            return _decode_float
        args = typing.get_args(hint)
        if typing.get_origin(hint) is list and len(args) == 1:
            (item,) = args
            if item in _EXACT:  # hot path: page and token lists
                def decode_plain_list(value):
                    if type(value) is not list:
                        raise _Reject
                    for v in value:
                        if type(v) is not item:
                            raise _Reject
                    return value
                return decode_plain_list
            dec = self._decoder(item)  # an optional item's decoder passes None through

            def decode_list(value):
                if type(value) is not list:
                    raise _Reject
                return list(map(dec, value))
            return decode_list
        inner = _optional(hint)
        if inner is not None:
            dec = self._decoder(inner)
            return lambda value: None if value is None else dec(value)
        return _reject

    def _dataclass_encoder(self, cls: type):
        """cls instance -> wire array; anything else -> whatever the walker makes of it."""
        return _compiled(self._encoders, cls, self._build_encoder)

    def _build_encoder(self, cls: type):
        fields = self._hints[cls]
        get = _getter([name for name, _ in fields])
        convert = [(i, enc) for i, (_, hint) in enumerate(fields) if (enc := self._encoder(hint)) is not None]
        if not convert:
            def encode(value):
                return get(value) if type(value) is cls else _to_wire(value)  # msgpack packs a tuple as an array
        else:
            def encode(value):
                if type(value) is not cls:
                    return _to_wire(value)
                wire = list(get(value))
                for i, enc in convert:
                    wire[i] = enc(wire[i])
                return wire
        return encode

    def _encoder(self, hint: Any):
        """``hint`` compiled to value -> wire value, or None when the value goes out as it is.

        Anything off the hint (a tuple, a list starting with an int) takes the walker,
        so the output is always the walker's.
        """
        if not any(dataclasses.is_dataclass(h) for h in _walk(hint)):
            return None
        if dataclasses.is_dataclass(hint):
            return self._dataclass_encoder(hint)
        args = typing.get_args(hint)
        if typing.get_origin(hint) is list and len(args) == 1:
            enc = self._encoder(args[0])  # an optional item's encoder passes None through

            def encode_list(value):
                if type(value) is not list or (value and type(value[0]) in _SCALARS):
                    return _to_wire(value)
                return list(map(enc, value))
            return encode_list
        inner = _optional(hint)
        if inner is not None:
            enc = self._encoder(inner)
            return lambda value: None if value is None else enc(value)
        return _to_wire

    # -- the hint walker: reference semantics, and the errors -------------

    def _from_wire(self, value: Any, hint: Any, path: str) -> Any:
        if dataclasses.is_dataclass(hint):
            fields = self._hints[hint]
            if not isinstance(value, list) or len(value) != len(fields):
                raise ProtocolError(f"{path}: expected {hint.__name__} with {len(fields)} fields")
            kwargs = {
                name: self._from_wire(v, h, f"{path}.{name}") for (name, h), v in zip(fields, value)
            }
            return hint(**kwargs)
        origin = typing.get_origin(hint)
        if origin is list:
            (item_hint,) = typing.get_args(hint)
            if not isinstance(value, list):
                raise ProtocolError(f"{path}: expected a list, got {type(value).__name__}")
            if item_hint is int:  # hot path: page and token lists
                if not all(type(v) is int for v in value):
                    raise ProtocolError(f"{path}: expected a list of int")
                return value
            return [self._from_wire(v, item_hint, f"{path}[{i}]") for i, v in enumerate(value)]
        if origin in (Union, types.UnionType):
            args = typing.get_args(hint)
            if value is None and type(None) in args:
                return None
            (inner,) = [a for a in args if a is not type(None)]
            return self._from_wire(value, inner, path)
        return _check_scalar(value, hint, path)


def _compiled(cache: dict, cls: type, build: Callable[[type], Callable]) -> Callable:
    """``build(cls)``, once per class; a recursive class meets a stand-in that calls the finished one."""
    if cls not in cache:
        cache[cls] = lambda value: cache[cls](value)
        cache[cls] = build(cls)
    return cache[cls]


def _decode_float(value: Any) -> float:
    if type(value) is float:
        return value
    if type(value) is int:
        return float(value)
    raise _Reject


def _reject(value: Any):
    raise _Reject


def _optional(hint: Any) -> Any:
    """``X`` for the hint ``X | None``; None for any other hint."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (Union, types.UnionType) and len(args) == 2 and type(None) in args:
        return args[0] if args[1] is type(None) else args[1]
    return None


def _constructor(cls: type, names: list[str]):
    """``cls`` itself when it takes the fields positionally, in order; else a keyword adapter."""
    params = inspect.signature(cls).parameters.values()
    if [p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD] == names and len(params) == len(names):
        return cls
    return lambda *values: cls(**dict(zip(names, values)))


def _getter(names: list[str]):
    """obj -> tuple of the named attributes (attrgetter returns a bare value for one name)."""
    if len(names) == 1:
        name = names[0]
        return lambda obj: (getattr(obj, name),)
    return operator.attrgetter(*names) if names else lambda obj: ()


def _check_scalar(value: Any, hint: Any, path: str) -> Any:
    if hint is int:
        if type(value) is not int:
            raise ProtocolError(f"{path}: expected int, got {type(value).__name__}")
    elif hint is float:
        if type(value) is int:
            return float(value)
        if type(value) is not float:
            raise ProtocolError(f"{path}: expected float, got {type(value).__name__}")
    elif hint is bool:
        if type(value) is not bool:
            raise ProtocolError(f"{path}: expected bool, got {type(value).__name__}")
    elif hint is str:
        if type(value) is not str:
            raise ProtocolError(f"{path}: expected str, got {type(value).__name__}")
    elif hint is bytes:
        if type(value) is not bytes:
            raise ProtocolError(f"{path}: expected bytes, got {type(value).__name__}")
    else:
        raise TypeError(f"{path}: unsupported field type {hint!r}")
    return value


def _to_wire(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return [_to_wire(getattr(value, f.name)) for f in dataclasses.fields(value)]
    if isinstance(value, list):
        if value and type(value[0]) in (int, float, bytes, str):
            return value
        return [_to_wire(v) for v in value]
    return value


def _walk(hint: Any):
    yield hint
    for arg in typing.get_args(hint):
        yield from _walk(arg)
