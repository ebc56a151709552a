"""One msgpack codec for every typed message that crosses a process boundary.

A message is a frozen dataclass registered under a short tag. On the wire an
envelope is the msgpack array ``[protocol_version, tag, request_id, body]`` where
``body`` lists the dataclass fields in declaration order (nested dataclasses the
same way). Decoding checks every field against its type hint, so a malformed
message from a peer becomes a :class:`ProtocolError` with a precise path
(``ForwardRequest.items[3].kv_page_ids[0]: expected int, got str``) instead of a
crash somewhere deep in a handler.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Union

import msgpack

__all__ = ["ProtocolError", "Codec", "Envelope"]


class ProtocolError(ValueError):
    """A message could not be decoded: wrong version, unknown tag or a bad field."""


@dataclasses.dataclass(frozen=True, slots=True)
class Envelope:
    request_id: int
    message: Any


_MAX_U64 = 2**64 - 1


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

    # -- encoding ---------------------------------------------------------

    def encode(self, message: Any, request_id: int = 0) -> bytes:
        tag = self._tag_by_class.get(type(message))
        if tag is None:
            raise TypeError(f"{type(message).__name__} is not a registered message")
        body = _to_wire(message)
        return msgpack.packb([self.version, tag, request_id, body], use_bin_type=True)

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
        return Envelope(request_id, self._from_wire(body, cls, cls.__name__))

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
