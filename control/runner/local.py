"""Host functions a runner answers itself: futures' values, the instance's identity and clock, the
model's facts and its tokenizer. None of them changes anything the control process keeps."""

from __future__ import annotations

import time
from math import nan as NAN
from types import SimpleNamespace

from wasmtime.component import Record, Variant

from oven.control.runtime import futures as f

from . import grammars, tokenize


def _take(guest, handle: int, kind: str):
    value, error = guest.futures.take(handle, kind)
    return error if error is not None else value


def take_dists(guest, handle: int):
    value, error = guest.futures.take(handle, f.DISTS)
    if error is not None:
        return error
    return [SimpleNamespace(**{"token-ids": ids, "probs": probs}) for ids, probs in value]


def take_token(guest, handle: int):
    value, error = guest.futures.take(handle, f.TOKEN)
    return error if error is not None else f.token_of(value)


def take_sampled(guest, handle: int):
    value, error = guest.futures.take(handle, f.TOKEN)
    if error is not None:
        return error
    sampled = Record()  # wasmtime-py accepts only its own Record for a record inside a result
    sampled.token, sampled.logprob, ids, logprobs = value if isinstance(value, list) else (value, NAN, [], [])
    setattr(sampled, "top-ids", ids)
    setattr(sampled, "top-logprobs", logprobs)
    return sampled


def take_text(guest, handle: int):
    value, error = guest.futures.take(handle, f.TEXT)
    # result<string, string> cannot be told apart by Python type: tag it explicitly.
    return Variant("err", error) if error is not None else Variant("ok", value)


def take_http(guest, handle: int):
    value, error = guest.futures.take(handle, f.HTTP)
    if error is not None:
        return error
    # wasmtime-py accepts only its own Record for a record inside a result.
    response = Record()
    response.status, response.body = value
    return response


def take_exit(guest, handle: int):
    value, error = guest.futures.take(handle, f.EXIT)
    if error is not None:
        return error
    child_exit = Record()  # wasmtime-py accepts only its own Record for a record inside a result
    child_exit.state, child_exit.code, child_exit.error, child_exit.messages = value
    return child_exit


def discard(guest, handle: int) -> None:
    """Forget it here, and in the control process, which may still hold it pending."""
    guest.futures.discard(handle)
    guest.forward("discard", (handle,), None)


FUTURES = {
    "poll": lambda guest, handles: guest.futures.ready(handles),
    "take-unit": lambda guest, handle: _take(guest, handle, f.UNIT),  # None = ok, str = err
    "take-handles": lambda guest, handle: _take(guest, handle, f.HANDLES),
    "take-dists": take_dists,
    "take-token": take_token,
    "take-sampled": take_sampled,
    "take-text": take_text,
    "take-http": take_http,
    "take-exit": take_exit,
    "discard": discard,
}

RUNTIME = {
    "arguments": lambda guest: list(guest.args),
    "instance-id": lambda guest: guest.instance_id,
    "now-ms": lambda guest: int(time.monotonic() * 1000),
    "models": lambda guest: [guest.setup.model_name],
    "available-traits": lambda guest: list(guest.setup.traits),
    "page-size": lambda guest: guest.setup.page_size,
}

INTERFACES = {"futures": FUTURES, "runtime": RUNTIME, "tokenize": tokenize.FUNCS, "grammars": grammars.FUNCS}
