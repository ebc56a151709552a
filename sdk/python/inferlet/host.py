"""The instance's host: arguments, messages, timers, HTTP, and the model's tokenizer."""

from __future__ import annotations

import math
from functools import cache

from componentize_py_types import Err
from wit_world.imports import adapters, futures, http, messaging, runtime, tokenize

from .tasks import HostFuture, OvenError


def args() -> list[str]:
    return runtime.arguments()


def instance_id() -> str:
    return runtime.instance_id()


def now_ms() -> int:
    """Monotonic milliseconds."""
    return runtime.now_ms()


def send(text: str) -> None:
    """A message to the client (and every attached client)."""
    messaging.send(text)


def receive() -> HostFuture:
    """The next message a client sends to this instance (await it)."""
    return HostFuture(messaging.receive(), futures.take_text)


def broadcast(topic: str, text: str) -> None:
    messaging.broadcast(topic, text)


def subscribe(topic: str) -> HostFuture:
    """The next message broadcast on ``topic`` (await it)."""
    return HostFuture(messaging.subscribe(topic), futures.take_text)


def sleep(ms: int) -> HostFuture:
    return HostFuture(runtime.sleep(ms), futures.take_unit)


def fetch(method: str, url: str, headers: list[str] = (), body: bytes = b"") -> HostFuture:
    """An HTTP request to an allow-listed host; the response has ``status`` and ``body``."""
    return HostFuture(http.fetch(method, url, list(headers), body), futures.take_http)


def pause_hint(ms: float) -> None:
    """The next wait on I/O (a tool, a fetch, a user) should last about ``ms`` milliseconds (rounded; an
    estimate may be fractional): the estimate the server's interception policy weighs keeping, swapping or
    dropping KV by. TypeError for what is not a number, ValueError for one that is not finite."""
    # Checked here: a value the WIT's u64 cannot take would trap the whole component, not raise.
    if isinstance(ms, bool) or not isinstance(ms, (int, float)):
        raise TypeError(f"pause_hint takes milliseconds as a number, not {type(ms).__name__}")
    if not math.isfinite(ms):
        raise ValueError(f"pause_hint takes a finite number of milliseconds, not {ms}")
    runtime.pause_hint(min(max(0, round(ms)), 2**64 - 1))


@cache
def page_size() -> int:
    """Tokens per KvPage."""
    return runtime.page_size()


def models() -> list[str]:
    """Names of the served models; the first is the default (the one this API drives)."""
    return runtime.models()


def available_traits() -> list[str]:
    """Traits of the default model, e.g. "forward-text", "kvpage-host-tier"."""
    return runtime.available_traits()


def open_adapter(name: str) -> int:
    """The id of the server's LoRA adapter ``name``, for ``Context(adapter=...)`` (0 is the base model).
    Raises OvenError naming why not: an unknown name, a model without the "lora-adapters" trait."""
    try:
        return adapters.open_adapter(name)
    except Err as err:
        raise OvenError(err.value) from None


def vocab_size() -> int:
    return tokenize.vocab_size()


@cache
def stop_tokens() -> frozenset[int]:
    """End-of-sequence and end-of-turn tokens."""
    return frozenset(tokenize.stop_tokens())


def encode(text: str) -> list[int]:
    return tokenize.tokenize(text)


def decode(tokens: list[int]) -> str:
    return tokenize.detokenize(tokens)


def render_chat(messages: list[dict], add_generation_prompt: bool = True) -> str:
    """``messages`` as [{"role": ..., "content": ...}] through the model's chat template."""
    return tokenize.render_chat([m["role"] for m in messages], [m["content"] for m in messages],
                                add_generation_prompt)
