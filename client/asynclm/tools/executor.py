"""Runs the model's function calls concurrently, one worker per call (AsyncLM §5.2).

The caller (the client's message loop) hands over each call as soon as the model
emits it and gets the result back through a callback, so that generation never
waits for execution. Every call ends in exactly one callback: a result, an error
or a timeout — never a hang or an exception in the caller.
"""

from __future__ import annotations

import logging
import threading
import time

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from .call import ToolError
from .registry import ToolRegistry

__all__ = ["CallTiming", "OnDone", "ToolExecutor"]

log = logging.getLogger(__name__)

OnDone = Callable[[str, str, bool], None]
"""``on_done(call_id, value, ok)``; called once per call, from a worker or timer thread."""


@dataclass(frozen=True, slots=True)
class CallTiming:
    """When one call was submitted, started on a worker and finished, in seconds of the
    executor's clock. ``started_s`` is None while queued; ``finished_s`` and ``ok`` are
    None while running."""

    call_id: str
    call_text: str
    submitted_s: float
    started_s: float | None
    finished_s: float | None
    ok: bool | None


@dataclass(slots=True)
class _Call:
    call_id: str
    call_text: str
    on_done: OnDone
    submitted_s: float
    started_s: float | None = None
    finished_s: float | None = None
    ok: bool | None = None
    # Set when the call has its outcome: a worker still in the emulated latency stops
    # waiting, so a timed-out call frees its worker at once.
    finished: threading.Event = field(default_factory=threading.Event)


class ToolExecutor:
    """Executes call texts through a :class:`ToolRegistry` on a thread pool.

    ``latency(call_text)`` (optional) gives an emulated execution time in seconds,
    slept on the worker before the real work (e.g. ``registry.latency_s`` or a
    :func:`~.latency.paper_latency`). ``timeout_s`` counts from the moment a worker
    starts the call, emulated latency included; a timed-out call reports
    ``"timeout after <timeout_s> s"``. A tool that hangs in real work keeps its
    worker (threads cannot be killed), but its caller is still answered on time.
    ``clock`` returns seconds; it stamps :meth:`timings`.
    """

    def __init__(
        self,
        registry: ToolRegistry,
        max_workers: int = 32,
        timeout_s: float = 30.0,
        latency: Callable[[str], float] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ):
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self._registry = registry
        self._timeout_s = float(timeout_s)
        self._latency = latency
        self._clock = clock
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="tool")
        self._lock = threading.Lock()
        self._calls: list[_Call] = []
        self._closed = False

    def __enter__(self) -> ToolExecutor:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def submit(self, call_id: str, call_text: str, on_done: OnDone) -> None:
        """Start ``call_text`` on a free worker (or queue it) and return at once.

        ``on_done(call_id, value, ok)`` is called exactly once: ``ok=True`` with the
        result text, or ``ok=False`` with what went wrong (the inferlet marks it ``error:``, once).
        Raises :class:`RuntimeError` after :meth:`close` (a bug in the caller).
        """
        call = _Call(call_id, call_text, on_done, submitted_s=self._clock())
        with self._lock:
            if self._closed:
                raise RuntimeError("submit after ToolExecutor.close()")
            self._calls.append(call)
            self._pool.submit(self._run, call)

    def timings(self) -> list[CallTiming]:
        """A snapshot of every call's timing, in submission order."""
        with self._lock:
            return [
                CallTiming(c.call_id, c.call_text, c.submitted_s, c.started_s, c.finished_s, c.ok)
                for c in self._calls
            ]

    def close(self, wait: bool = True) -> None:
        """Accept no more calls; with ``wait``, return once every submitted call has run
        (a tool hung in real work, already answered with a timeout, still blocks this)."""
        with self._lock:
            self._closed = True
        self._pool.shutdown(wait=wait)

    def _run(self, call: _Call) -> None:
        with self._lock:
            call.started_s = self._clock()
        timer = threading.Timer(
            self._timeout_s, self._finish, (call, f"timeout after {self._timeout_s} s", False)
        )
        timer.daemon = True
        timer.start()
        try:
            value, ok = self._execute(call)
        finally:
            timer.cancel()
        self._finish(call, value, ok)

    def _execute(self, call: _Call) -> tuple[str, bool]:
        try:
            delay_s = self._latency(call.call_text) if self._latency is not None else 0.0
            if delay_s > 0 and call.finished.wait(delay_s):
                return "", False  # timed out while emulating latency; already answered
            return self._registry.execute(call.call_text), True
        except ToolError as e:
            return str(e), False
        except Exception as e:  # a broken latency callable or registry: still answer
            return f"{call.call_text.strip()}: {type(e).__name__}: {e}", False

    def _finish(self, call: _Call, value: str, ok: bool) -> None:
        # The worker and the timeout timer race; the first to get here answers.
        with self._lock:
            if call.finished.is_set():
                return
            call.finished.set()
            call.finished_s = self._clock()
            call.ok = ok
        try:
            call.on_done(call.call_id, value, ok)
        except Exception:
            log.exception("on_done for call %s raised", call.call_id)
