"""Decoders from the control side (control/runtime/decoders.py): a decoder's spec travels with its items
until one is answered, it is dropped in the inference process only once its inferlet dropped it and
no command naming it is unsettled, and one made for an earlier inference process is lost, clearly."""

from __future__ import annotations

import pytest

from oven.control.runtime.decoders import DecoderIds
from oven.proto import inference as p

SPEC = p.DecoderSpec(grammar="", presence=0.5)


def test_the_spec_travels_until_an_item_naming_it_is_answered():
    ids = DecoderIds()
    decoder = ids.create(SPEC)
    first, second = ids.shape_for(decoder), ids.shape_for(decoder)  # pipelined: both sent before a reply
    assert first == second == (decoder.decoder_id, SPEC)
    ids.release(decoder, answered=False)  # failed before the inference process made it
    assert ids.shape_for(decoder) == (decoder.decoder_id, SPEC)
    ids.release(decoder, answered=True)
    assert ids.shape_for(decoder) == (decoder.decoder_id, None)


def test_a_dropped_decoder_goes_once_its_commands_settle_and_only_once():
    ids = DecoderIds()
    decoder = ids.create(SPEC)
    ids.shape_for(decoder)
    ids.drop(decoder)
    assert ids.take_drops() == []  # a command naming it is still unsettled
    ids.release(decoder, answered=True)
    assert ids.take_drops() == [decoder.decoder_id]
    ids.drop(decoder)
    assert ids.take_drops() == []


def test_ids_are_never_reused_and_a_restart_loses_every_decoder():
    ids = DecoderIds()
    a = ids.create(SPEC)
    ids.drop(a)
    b = ids.create(SPEC)
    assert b.decoder_id != a.decoder_id and ids.take_drops() == [a.decoder_id]
    ids.shape_for(b)
    ids.reset()  # a new inference process
    ids.release(b, answered=True)  # a reply of the old one, if any, confirms nothing
    with pytest.raises(ValueError, match="lost when the inference process restarted"):
        ids.shape_for(b)
    ids.drop(b)
    assert ids.take_drops() == []  # the new process never had it
