"""``adapters``: opening a LoRA adapter by name (its id goes with each forward that uses it)."""

from __future__ import annotations

from ..adapters import AdapterUnavailable


def open_adapter(inst, name: str) -> int | str:
    """The adapter's id, or why it cannot be used (a WIT ``result``: a string is the error)."""
    try:
        return inst.host.adapters.open(name)
    except AdapterUnavailable as exc:
        return str(exc)


FUNCS = {"open-adapter": open_adapter}
