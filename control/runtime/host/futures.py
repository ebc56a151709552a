"""``futures``: poll, take the value of a completed future, discard."""

from __future__ import annotations

from types import SimpleNamespace

from wasmtime.component import Record, Variant

from .. import futures as f


def poll(inst, handles: list[int]) -> list[int]:
    return inst.futures.ready(handles)


def _take(inst, handle: int, kind: str):
    value, error = inst.futures.take(handle, kind)
    return error if error is not None else value


def take_unit(inst, handle: int):
    return _take(inst, handle, f.UNIT)  # None = ok, str = err


def take_handles(inst, handle: int):
    return _take(inst, handle, f.HANDLES)


def take_dists(inst, handle: int):
    value, error = inst.futures.take(handle, f.DISTS)
    if error is not None:
        return error
    return [SimpleNamespace(**{"token-ids": ids, "probs": probs}) for ids, probs in value]


def take_token(inst, handle: int):
    return _take(inst, handle, f.TOKEN)


def take_text(inst, handle: int):
    value, error = inst.futures.take(handle, f.TEXT)
    # result<string, string> cannot be told apart by Python type: tag it explicitly.
    return Variant("err", error) if error is not None else Variant("ok", value)


def take_http(inst, handle: int):
    value, error = inst.futures.take(handle, f.HTTP)
    if error is not None:
        return error
    # wasmtime-py accepts only its own Record for a record inside a result.
    response = Record()
    response.status, response.body = value
    return response


def discard(inst, handle: int) -> None:
    inst.futures.discard(handle)


FUNCS = {
    "poll": poll,
    "take-unit": take_unit,
    "take-handles": take_handles,
    "take-dists": take_dists,
    "take-token": take_token,
    "take-text": take_text,
    "take-http": take_http,
    "discard": discard,
}
