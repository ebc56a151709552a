"""``futures``: the one call the control process hears of (the runner answers poll and take-* itself)."""

from __future__ import annotations


def discard(inst, handle: int) -> None:
    """A future whose value the guest does not want: forget it, settled or not."""
    inst.futures.discard(handle)


FUNCS = {"discard": discard}
