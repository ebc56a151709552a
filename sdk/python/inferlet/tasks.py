"""A small single-threaded event loop for inferlets, driven by the host's ``start``/``resume``.

Coroutines await :class:`Future` objects. A :class:`HostFuture` wraps a handle the host
returned; when the inferlet has nothing left to run, the loop hands the host the handles
that somebody awaits, and ``resume`` completes those that are ready by taking their values.
Nothing here blocks: waiting is returning to the host.
"""

from __future__ import annotations

import gc
import os
import sys
import traceback

from componentize_py_types import Err
from wit_world.imports import futures, runtime


class OvenError(Exception):
    """A call the host failed (bad handle, quota, pool exhausted, ...); the message is the host's."""


class Future:
    __slots__ = ("_done", "_value", "_error", "_callbacks")

    def __init__(self):
        self._done, self._value, self._error, self._callbacks = False, None, None, []

    def done(self) -> bool:
        return self._done

    def result(self):
        if not self._done:
            raise RuntimeError("the future has not completed")
        if self._error is not None:
            raise self._error
        return self._value

    def set_result(self, value) -> None:
        self._finish(value, None)

    def set_exception(self, error: BaseException) -> None:
        self._finish(None, error)

    def add_done_callback(self, callback) -> None:
        if self._done:
            callback(self)
        else:
            self._callbacks.append(callback)

    def _finish(self, value, error) -> None:
        if self._done:
            raise RuntimeError("the future has already completed")
        self._done, self._value, self._error = True, value, error
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(self)

    def __await__(self):
        if not self._done:
            yield self
        if self._error is not None:
            raise self._error
        return self._value


class HostFuture(Future):
    """A host call's pending result; ``take`` is the matching ``futures.take-*`` getter."""

    __slots__ = ("handle", "_take")

    def __init__(self, handle: int, take):  # written out, like the methods below: this is the per-call path
        self._done, self._value, self._error, self._callbacks = False, None, None, []
        self.handle, self._take = handle, take

    def add_done_callback(self, callback) -> None:
        if self._done:
            callback(self)
        else:
            LOOP.waiting[self.handle] = self
            self._callbacks.append(callback)

    def poll_now(self) -> "HostFuture":
        """Ask the host whether the call has completed, and take its value if so, instead of waiting
        to be told: for a call issued long before it is awaited, which has likely completed."""
        if not self._done and futures.poll([self.handle]):
            self.complete()
        return self

    def complete(self) -> None:
        try:
            value = self._take(self.handle)
        except Err as err:
            self.set_exception(OvenError(err.value))
        else:
            self.set_result(value)


class Task(Future):
    """A running coroutine; awaiting it gives its return value."""

    __slots__ = ("_coro", "_awaited")

    def __init__(self, coro):
        super().__init__()
        self._coro, self._awaited = coro, None
        LOOP.ready.append(self)

    def _step(self) -> None:
        awaited, self._awaited = self._awaited, None
        try:
            if awaited is None:
                nxt = self._coro.send(None)
            elif awaited._error is None:
                nxt = self._coro.send(awaited._value)
            else:
                nxt = self._coro.throw(awaited._error)
        except StopIteration as stop:
            self.set_result(stop.value)
            return
        except BaseException as exc:  # noqa: BLE001 - delivered to whoever awaits the task
            self.set_exception(exc)
            return
        if not isinstance(nxt, Future):
            self._coro.close()
            self.set_exception(TypeError(f"inferlet coroutines may only await oven futures, not {nxt!r}"))
            return
        self._awaited = nxt
        nxt.add_done_callback(self._wake)

    def _wake(self, _future) -> None:
        LOOP.ready.append(self)


class EventLoop:
    def __init__(self):
        self.ready: list[Task] = []
        self.waiting: dict[int, HostFuture] = {}
        self.main: Task | None = None

    def run_ready(self) -> list[int]:
        """Step every runnable task; return the handles to wait on (empty: the inferlet is done)."""
        while self.ready:
            ready, self.ready = self.ready, []
            for task in ready:
                task._step()
        if self.main.done():
            error = self.main._error
            if error is not None:
                return _end_with(error)
            if isinstance(self.main._value, int):
                runtime.set_exit_code(self.main._value)
            return []
        if not self.waiting:
            raise RuntimeError("main is waiting, but on no host call: it can never be resumed")
        return list(self.waiting)

    def resume(self, ready: list[int]) -> list[int]:
        for handle in ready:
            future = self.waiting.pop(handle, None)
            if future is not None:
                future.complete()
        return self.run_ready()


LOOP = EventLoop()


def _end_with(error: BaseException) -> list[int]:
    """End the instance for an exception out of ``main``, as Python ends a program.

    ``SystemExit`` (``sys.exit``, a usage error raised on purpose) ends it with its status, or with
    its message alone on stderr and status 1. Any other exception prints its traceback once and
    exits with status 1: the host then names the exception as the reason the instance failed.
    Exiting (not raising out of ``resume``) keeps the runtime from printing it again and panicking.
    """
    if isinstance(error, SystemExit):
        if error.code is None or isinstance(error.code, int):
            runtime.set_exit_code(error.code or 0)
        else:
            print(error.code, file=sys.stderr)
            runtime.set_exit_code(1)
        _flush_output()
        return []
    traceback.print_exception(error, file=sys.stderr)
    _flush_output()
    os._exit(1)


def _flush_output() -> None:
    """Inside wasm neither stream is a terminal: what was printed last (argparse's --help) may still wait."""
    sys.stderr.flush()
    sys.stdout.flush()


def spawn(coro) -> Task:
    """Run ``coro`` concurrently; await the task for its result."""
    return Task(coro)


async def gather(*awaitables) -> list:
    """Await all of ``awaitables`` (futures or coroutines, run concurrently); their results in order."""
    futures_ = [a if isinstance(a, Future) else Task(a) for a in awaitables]
    return [await f for f in futures_]


def run(main):
    """The ``WitWorld`` class for an inferlet whose entry point is ``async def main(args)``.

    ``main`` returns None or an exit code; an exception ends the instance (see :func:`_end_with`).
    """
    import wit_world

    class Driver(wit_world.WitWorld):
        def start(self) -> list[int]:
            # The interpreter's own objects never die: keep the collector from scanning them, and
            # collect young objects less often (each decode step makes a few; few form cycles).
            gc.freeze()
            gc.set_threshold(20_000, 20, 20)
            LOOP.main = Task(main(runtime.arguments()))
            return LOOP.run_ready()

        def resume(self, ready: list[int]) -> list[int]:
            return LOOP.resume(ready)

    return Driver
