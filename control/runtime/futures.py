"""Per-instance table of futures: the handles an inferlet waits on.

A future has a kind that decides which ``take-*`` getter may read it. The
control loop completes futures as batch replies, timers and messages arrive;
completing one marks its instance runnable (``on_ready``) and queues it for the
instance's runner (:meth:`FutureTable.deliver`), which keeps a table of its own
(created with kind "", the kind arriving with the value) from which the guest takes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

UNIT, HANDLES, DISTS, TOKEN, TEXT, HTTP, EXIT = "unit", "handles", "dists", "token", "text", "http", "exit"
# Futures one instance may hold at once (issued, not yet taken or dropped): each is control memory,
# and an inferlet that issues calls it never takes must hurt only itself (it is trapped past this).
MAX_FUTURES = 1 << 16


def token_of(value) -> int:
    """A token future's token: its value, or the first of ``[token, logprob, top ids, top logprobs]``
    when log-probabilities were asked for (forward-sample-shaped)."""
    return value[0] if isinstance(value, list) else value


class FutureError(ValueError):
    """A guest used a future handle wrongly (unknown, not ready, wrong getter): it is trapped."""


@dataclass(slots=True)
class Future:
    handle: int
    kind: str
    io: bool = False  # waits on the outside world (message, http, timer), not on the GPU
    done: bool = False
    value: Any = None
    error: str | None = None
    token_slot: int = -1  # a token future: the inference process's slot its token is drawn into
    callbacks: list[Callable[["Future"], None]] = field(default_factory=list)


class FutureTable:
    def __init__(self, on_ready: Callable[[int], None], delivers: bool = True):
        """``delivers``: settled futures wait for :meth:`deliver` (the control process's side)."""
        self._futures: dict[int, Future] = {}
        self._delivers = delivers
        self._next_handle = 1
        self._on_ready = on_ready
        self._settled: list[int] = []  # handles settled since the last deliver()

    def __len__(self) -> int:
        return len(self._futures)

    def create(self, kind: str, io: bool = False) -> Future:
        if len(self._futures) >= MAX_FUTURES:
            raise FutureError(f"{MAX_FUTURES} futures are held already: take or drop some before issuing more")
        fut = Future(self._next_handle, kind, io)
        self._next_handle += 1
        self._futures[fut.handle] = fut
        return fut

    def complete(self, fut: Future, value: Any = None) -> None:
        self._settle(fut, value, None)

    def fail(self, fut: Future, error: str) -> None:
        self._settle(fut, None, error)

    def _settle(self, fut: Future, value: Any, error: str | None) -> None:
        if fut.done:
            return
        fut.done, fut.value, fut.error = True, value, error
        for callback in fut.callbacks:
            callback(fut)
        if fut.handle in self._futures:
            if self._delivers:
                self._settled.append(fut.handle)
            self._on_ready(fut.handle)

    def deliver(self) -> list[list]:
        """``[handle, kind, value, error]`` of every future settled since the last call, which are then
        forgotten here: the runner holds them until the guest takes them."""
        out = []
        for handle in self._settled:
            fut = self._futures.pop(handle, None)
            if fut is not None:
                out.append([handle, fut.kind, fut.value, fut.error])
        self._settled.clear()
        return out

    def settle_delivered(self, handle: int, kind: str, value: Any, error: str | None) -> None:
        """The runner's side of :meth:`deliver`: future ``handle`` settled (nothing if discarded)."""
        fut = self._futures.get(handle)
        if fut is not None:
            fut.kind = kind
            self._settle(fut, value, error)

    def ready(self, handles: list[int]) -> list[int]:
        return [h for h in handles if (f := self._futures.get(h)) is not None and f.done]

    def get(self, handle: int) -> Future:
        return self._futures[handle]

    def is_known(self, handle: int) -> bool:
        return handle in self._futures

    def take(self, handle: int, kind: str) -> tuple[Any, str | None]:
        """(value, error) of a completed future, which is then forgotten."""
        fut = self._futures.get(handle)
        if fut is None:
            raise FutureError(f"future {handle} is unknown (never issued, or already taken)")
        if not fut.done:
            raise FutureError(f"future {handle} has not completed yet")
        if fut.kind != kind:
            raise FutureError(f"future {handle} holds a {fut.kind} result, not {kind}")
        del self._futures[handle]
        return fut.value, fut.error

    def discard(self, handle: int) -> None:
        self._futures.pop(handle, None)

    def pending(self) -> list[Future]:
        return [f for f in self._futures.values() if not f.done]
