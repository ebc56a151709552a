"""Child instances: an inferlet launches inferlets (WIT ``children``), awaits how they ended or cancels them.

A child is an ordinary instance of its parent's client (``owner``): it runs in that client's runner and
counts against that client's ``max_instances_per_client`` (the operator is exempt, as at a client's own
launch), so a fork bomb hurts only its client. What bounds it beyond that: the depth of nesting
(``max_launch_depth``) and the children one instance holds (``max_children_per_instance``: running, or
ended with an exit no ``wait-child`` has taken yet). A child dies with its parent: ending an instance,
however it ends, kills its children still running (:meth:`Children.parent_ended`). A child's ``send``s
reach its clients as any instance's do and are kept for its parent too, within the inbox's bounds
(``inbox_messages``, ``inbox_mib``): past them the child fails.

Child handles are per parent (1, 2, ...): a handle this instance does not hold is an error naming it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from oven.proto.auth import OPERATOR

from . import futures as f
from .instance import State
from .programs import ProgramError

if TYPE_CHECKING:
    from .instance import Instance

CANCELLED = "cancelled by its parent"
PARENT_ENDED = "its parent ended"
KILLED_EXIT_CODE = 143  # as a client's terminate: ended from outside


class ChildError(ValueError):
    """A launch, wait or cancel the guest may handle: the message is the WIT ``result``'s error."""


def exit_value(child: Instance) -> list:
    """An ended child as ``take-exit`` gives it: [state, code, error, messages]."""
    return [child.state.value, child.exit_code or 0, child.error or "", list(child.messages_for_parent)]


class Children:
    """The rules of launching children, over the loop's own ``launch(program, args, owner)`` and
    ``kill(inst, reason, exit_code, state)``; ``num_instances(owner)`` counts a client's running instances."""

    def __init__(self, launch: Callable[..., Instance], kill: Callable[..., None],
                 num_instances: Callable[[str], int], launch_name: Callable[[str, str, str], str],
                 max_depth: int, max_children: int, max_per_client: int):
        self._launch, self._kill, self._num_instances, self._launch_name = launch, kill, num_instances, launch_name
        self.max_depth, self.max_children, self.max_per_client = max_depth, max_children, max_per_client

    def launch(self, parent: Instance, program: str, args: list[str]) -> int:
        """The new child's handle in ``parent``; ChildError naming why not."""
        where = f"launch {program[:80]!r}"
        if parent.depth + 1 > self.max_depth:
            raise ChildError(f"{where}: its child would be at depth {parent.depth + 1}, past the server's maximum "
                             f"of {self.max_depth} (oven serve --max-launch-depth)")
        if len(parent.children) >= self.max_children:
            raise ChildError(f"{where}: this inferlet holds {len(parent.children)} children, its maximum (oven serve "
                             "--max-children-per-instance); wait for some first")
        if parent.owner != OPERATOR and (running := self._num_instances(parent.owner)) >= self.max_per_client:
            raise ChildError(f"{where}: this client runs {running} instances, its maximum "
                             "(oven serve --max-instances-per-client)")
        try:
            child = self._launch(program, list(args), parent.owner)
        except (ProgramError, RuntimeError) as exc:
            raise ChildError(f"{where}: {exc}") from None
        child.launched_as = self._launch_name(program, child.program, parent.owner)
        child.parent, child.depth = parent, parent.depth + 1
        parent.num_children_made += 1
        parent.children[parent.num_children_made] = child
        return parent.num_children_made

    def wait(self, parent: Instance, handle: int) -> int:
        """A future that completes with the child's exit (``take-exit``) once it has ended, when the
        handle is released; failed at once for a handle ``parent`` does not hold."""
        fut = parent.futures.create(f.EXIT, io=True)
        child = parent.children.get(handle)
        if child is None:
            parent.futures.fail(fut, f"wait-child: {_not_held(handle)}")
        elif not child.alive:
            del parent.children[handle]
            parent.futures.complete(fut, exit_value(child))
        else:
            def settle(value: list) -> None:
                parent.children.pop(handle, None)
                parent.futures.complete(fut, value)
            child.exit_waiters.append(settle)
        return fut.handle

    def cancel(self, parent: Instance, handle: int) -> None:
        child = parent.children.get(handle)
        if child is None:
            raise ChildError(f"cancel-child: {_not_held(handle)}")
        self._kill(child, CANCELLED, KILLED_EXIT_CODE, State.KILLED)

    def parent_ended(self, parent: Instance) -> None:
        """Kill ``parent``'s children still running (and theirs, as each ends)."""
        for child in list(parent.children.values()):
            self._kill(child, PARENT_ENDED, KILLED_EXIT_CODE, State.KILLED)
        parent.children.clear()

    @staticmethod
    def child_ended(child: Instance) -> None:
        """Settle the waits of ``child``'s parent for it."""
        waiters, child.exit_waiters = child.exit_waiters, []
        for settle in waiters:
            settle(exit_value(child))


def _not_held(handle: int) -> str:
    return f"child {handle} is not held by this inferlet (never launched here, or its exit already taken)"
