"""The AsyncLM session's printer (client/asynclm/session.py): what a user sees of a stream."""

from __future__ import annotations

import io

from oven.client.asynclm.session import StreamPrinter


def printed(event: dict) -> str:
    out = io.StringIO()
    StreamPrinter(out)(event)
    return out.getvalue()


def test_an_interrupt_line_says_what_it_leaves_out():
    assert printed({"type": "intr", "id": "t1", "value": "x" * 100}) == f"\n  ⇠ interrupt t1: {'x' * 100}\n"
    assert printed({"type": "intr", "id": "t2", "value": "y" * 100 + "z" * 42}) == (
        f"\n  ⇠ interrupt t2: {'y' * 100}… (42 more characters)\n")
