"""Child instances (composition): launch another inferlet under this instance's client, await how it
ended, or cancel it (WIT ``children``). A child dies with its parent."""

from __future__ import annotations

from typing import NamedTuple

from componentize_py_types import Err
from wit_world.imports import children, futures

from .tasks import HostFuture, OvenError


class ChildExit(NamedTuple):
    """How a child ended: ``state`` "finished", "failed" or "killed"; its exit ``code``; ``error``, why it
    did not finish ("" if it did); ``messages``, what it sent, in order."""

    state: str
    code: int
    error: str
    messages: list[str]


def _take_exit(handle: int) -> ChildExit:
    exit_ = futures.take_exit(handle)
    return ChildExit(exit_.state, exit_.code, exit_.error, list(exit_.messages))


class Child:
    """A child instance this one launched (:func:`launch`); its handle is this instance's own."""

    __slots__ = ("handle", "_exit")

    def __init__(self, handle: int):
        self.handle, self._exit = handle, None

    def wait(self) -> HostFuture:
        """Await it for the child's :class:`ChildExit`. The handle is released once it has ended; every
        call of ``wait`` gives the same future."""
        if self._exit is None:
            self._exit = HostFuture(children.wait_child(self.handle), _take_exit)
        return self._exit

    def cancel(self) -> None:
        """End the child now (state "killed", error "cancelled by its parent"); one that has ended
        already is left as it ended. ``wait`` still gives its exit."""
        try:
            children.cancel_child(self.handle)
        except Err as err:
            raise OvenError(err.value) from None


def launch(program: str, args: list[str] = ()) -> Child:
    """Launch ``program`` (its name or hash, as this instance's client would launch it: the client's own
    upload, a shared program, a library inferlet) with ``args``. Raises OvenError naming why not: an
    unknown program, the client's or the server's cap on instances, the cap on nesting depth or on the
    children one instance holds."""
    try:
        return Child(children.launch(program, list(args)))
    except Err as err:
        raise OvenError(err.value) from None
