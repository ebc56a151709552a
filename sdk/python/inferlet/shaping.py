"""Shaping what a generation may draw: grammars (JSON Schema, regex, Lark, a choice of strings),
allowed-token masks, logit biases, penalties, and the model's log-probabilities per token.

The server applies a ``Shape`` before each draw (WIT ``forward-sample-shaped``); a grammar and the
penalties live there in a *decoder* that every drawn token advances, so a shaped generation stays
pipelined (one step in flight ahead). Log-probabilities are the model's own, before shaping.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from componentize_py_types import Err
from wit_world.imports import forward, grammars

from .tasks import OvenError

_KINDS = {"json-schema": grammars.GrammarKind.JSON_SCHEMA, "regex": grammars.GrammarKind.REGEX,
          "lark": grammars.GrammarKind.LARK, "choice": grammars.GrammarKind.CHOICE}


class Grammar:
    """A grammar the server checked and compiled for its tokenizer. Raises OvenError with the reason
    (line and column for Lark) when it cannot be used. ``drop()`` frees it (an instance holds at most 64)."""

    def __init__(self, kind: str, spec: str):
        if kind not in _KINDS:
            raise ValueError(f"unknown grammar kind {kind!r} (one of {', '.join(_KINDS)})")
        try:
            self.handle = grammars.create_grammar(_KINDS[kind], spec)
        except Err as err:
            raise OvenError(err.value) from None
        self.kind = kind

    @classmethod
    def json_schema(cls, schema: dict | str | bool) -> Grammar:
        """JSON text that validates against ``schema`` (a dict, or its JSON text)."""
        return cls("json-schema", schema if isinstance(schema, str) else json.dumps(schema))

    @classmethod
    def json(cls) -> Grammar:
        """Any JSON object (OpenAI's ``json_object``)."""
        return cls.json_schema({"type": "object"})

    @classmethod
    def regex(cls, pattern: str) -> Grammar:
        return cls("regex", pattern)

    @classmethod
    def lark(cls, grammar: str) -> Grammar:
        return cls("lark", grammar)

    @classmethod
    def choice(cls, options: list[str]) -> Grammar:
        """Exactly one of ``options``."""
        return cls("choice", json.dumps(list(options)))

    def drop(self) -> None:
        grammars.drop_grammar(self.handle)


@dataclass(frozen=True)
class Shape:
    """How each step's logits are changed before the draw, in this order: ``bias`` (token -> added
    logit; ``float("-inf")`` bans it), penalties (OpenAI's ``presence``/``frequency`` over the tokens
    this generation drew, vLLM's ``repetition`` over its inputs and draws), tokens outside ``allowed``
    (None: all) and outside ``grammar`` removed. ``logprobs`` >= 0 records each drawn token's
    log-probability and the ``logprobs`` most probable (``Context.logprobs``); -1 records none."""

    grammar: Grammar | None = None
    allowed: frozenset[int] | None = None
    bias: dict[int, float] = field(default_factory=dict)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logprobs: int = -1

    def needs_decoder(self) -> bool:
        return (self.grammar is not None or self.presence_penalty != 0 or self.frequency_penalty != 0
                or self.repetition_penalty != 1)


@dataclass(frozen=True)
class Logprobs:
    """A drawn token's log-probability under the model, and the ``top`` most probable (id, logprob)."""

    token: int
    logprob: float
    top: list[tuple[int, float]]


class Decoder:
    """The server's state for one shaped generation (its grammar's matcher, its penalty counts)."""

    def __init__(self, shape: Shape):
        grammar = shape.grammar.handle if shape.grammar is not None else 0
        try:
            self.handle = grammars.create_decoder(grammar, shape.presence_penalty, shape.frequency_penalty,
                                                  shape.repetition_penalty)
        except Err as err:
            raise OvenError(err.value) from None

    def drop(self) -> None:
        grammars.drop_decoder(self.handle)


def wit_shaping(shape: Shape, decoder: Decoder | None, vocab_size: int) -> forward.Shaping:
    allowed = b""
    if shape.allowed is not None:
        bits = bytearray((vocab_size + 7) // 8)
        for token in shape.allowed:
            if not 0 <= token < vocab_size:
                raise ValueError(f"allowed token {token} is outside the vocabulary of {vocab_size}")
            bits[token >> 3] |= 0x80 >> (token & 7)  # numpy.packbits order: the first token is the high bit
        allowed = bytes(bits)
    return forward.Shaping(decoder.handle if decoder is not None else 0, allowed, list(shape.bias),
                           [float(v) for v in shape.bias.values()], shape.logprobs)


def logprobs_of(sampled) -> Logprobs:
    return Logprobs(sampled.token, sampled.logprob, list(zip(sampled.top_ids, sampled.top_logprobs)))
