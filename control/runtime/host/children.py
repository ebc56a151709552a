"""``children``: launching child instances, waiting for them and cancelling them (rules in ``..children``)."""

from __future__ import annotations

from ..children import ChildError


def launch(inst, program: str, args: list[str]) -> int | str:
    """The child's handle, or why not (a WIT ``result``: a string is the error)."""
    try:
        return inst.host.children.launch(inst, program, args)
    except ChildError as exc:
        return str(exc)


def cancel_child(inst, child: int) -> str | None:
    try:
        inst.host.children.cancel(inst, child)
    except ChildError as exc:
        return str(exc)
    return None


FUNCS = {
    "launch": launch,
    "wait-child": lambda inst, child: inst.host.children.wait(inst, child),
    "cancel-child": cancel_child,
}
