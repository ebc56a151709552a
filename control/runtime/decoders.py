"""Decoders from the control side: which inference-process decoder each inferlet handle names, and when
one may be forgotten there.

A decoder (proto/inference.py, "Shaping") is state the inference process keeps for one generation: a
grammar matcher and penalty counts that each drawn token advances. This side hands out its ids
(never reused, so a late item cannot reach another inferlet's decoder) and sends its spec with every
item that names it until one such item has been answered: the inference process makes it from the
first and ignores the rest, and a queue destroyed before its item was sent loses nothing. A decoder
is dropped there once its inferlet dropped it (or ended) and no command naming it is unsettled.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from oven.proto import inference as p

MAX_GRAMMARS, MAX_DECODERS = 64, 256  # per instance (the WIT says so); the runner checks them first


@dataclass(slots=True)
class Decoder:
    decoder_id: int
    spec: p.DecoderSpec
    epoch: int  # the inference process it was made for
    confirmed: bool = False  # an item naming it was answered: the inference process has it
    holds: int = 0  # commands naming it not settled
    dropped: bool = False


class DecoderIds:
    """The decoders of one inference connection: ids, and those to drop there."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self.epoch = 0  # counts inference processes: a decoder made for an earlier one is lost
        self.to_drop: list[int] = []

    def create(self, spec: p.DecoderSpec) -> Decoder:
        return Decoder(next(self._ids), spec, self.epoch)

    def shape_for(self, decoder: Decoder) -> tuple[int, p.DecoderSpec | None]:
        """(id, spec or None) for an item naming ``decoder``; ValueError if it was lost with an earlier
        inference process. The item's command holds it until :meth:`release`."""
        if decoder.epoch != self.epoch:
            raise ValueError("its decoder was lost when the inference process restarted: create another")
        decoder.holds += 1
        return decoder.decoder_id, None if decoder.confirmed else decoder.spec

    def release(self, decoder: Decoder, answered: bool) -> None:
        """A command naming ``decoder`` settled (``answered``: by the inference process's reply)."""
        decoder.holds -= 1
        decoder.confirmed |= answered and decoder.epoch == self.epoch
        self._maybe_drop(decoder)

    def drop(self, decoder: Decoder) -> None:
        decoder.dropped = True
        self._maybe_drop(decoder)

    def _maybe_drop(self, decoder: Decoder) -> None:
        if decoder.dropped and not decoder.holds and decoder.epoch == self.epoch:
            decoder.epoch = -1  # once
            self.to_drop.append(decoder.decoder_id)

    def take_drops(self) -> list[int]:
        drops, self.to_drop = self.to_drop, []
        return drops

    def reset(self) -> None:
        """A new inference process: it holds no decoder."""
        self.epoch += 1
        self.to_drop.clear()
