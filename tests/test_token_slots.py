"""The control side's token future slots (control/runtime/token_slots.py): held while a command uses
them, reused lowest first, all forgotten for a new inference process."""

from __future__ import annotations

import pytest
from oven.control.runtime.token_slots import TokenSlots


def test_a_slot_is_free_once_every_command_that_used_it_has_settled():
    slots = TokenSlots()
    a, b = slots.allocate(), slots.allocate()
    assert (a, b) == (0, 1)
    slots.hold(a)  # a step fed by a's token, sent before a's reply
    slots.release(a)  # a's own command settled
    assert slots.allocate() == 2 and len(slots) == 3  # a is still read
    slots.release(a)
    slots.release(b)
    assert slots.allocate() == 0 and slots.allocate() == 1  # lowest first: the table stays small
    assert slots.high_water == 3
    with pytest.raises(KeyError):
        slots.hold(7)


def test_reset_forgets_every_slot():
    slots = TokenSlots()
    slots.allocate()
    slots.reset()
    assert len(slots) == 0 and slots.allocate() == 0
