"""Decoders: the state a constrained or penalised generation keeps in this process between its steps.

A decoder (proto/inference.py, "Shaping") holds a grammar matcher and the counts its penalties
read. It lives here, where tokens are drawn, so that the token drawn at one step has advanced the
matcher before the next step, sent before that token came back, is masked: pipelined decode keeps
working under a grammar, as in vLLM's and SGLang's engines.
"""

from __future__ import annotations

from collections import Counter

from oven.proto import grammar as g
from oven.proto import inference as p

from .validate import ItemFailure

MAX_DECODERS = 1 << 14  # per connection: a sender that never drops cannot grow this process without bound


class Decoder:
    def __init__(self, spec: p.DecoderSpec, matcher):
        self.spec = spec
        self.matcher = matcher  # llguidance.LLMatcher, or None without a grammar
        self.seen: set[int] = set()  # inputs and draws: what repetition penalises
        self.drawn: Counter[int] = Counter()  # draws: what presence and frequency penalise

    @property
    def penalises(self) -> bool:
        s = self.spec
        return s.presence != 0 or s.frequency != 0 or s.repetition != 1

    def see(self, tokens: list[int]) -> None:
        if self.spec.repetition != 1:
            self.seen.update(tokens)

    def draw(self, token: int, advance_matcher: bool = True) -> None:
        """The token drawn under this decoder: the counts move past it, and the matcher unless
        ``advance_matcher`` is False (the engine then advances it on its mask worker: ``advance``)."""
        if advance_matcher:
            self.advance(token)
        self.drawn[token] += 1
        self.see([token])

    def advance(self, token: int) -> None:
        if self.matcher is not None:
            self.matcher.consume_token(token)  # a masked draw is always accepted; an error stays in the matcher


class Decoders:
    """One connection's decoders by the id the sender chose; ``llg_tokenizer()`` gives llguidance's view
    of the served tokenizer (built on first use: a second or so)."""

    def __init__(self, llg_tokenizer, max_decoders: int = MAX_DECODERS):
        self._llg_tokenizer = llg_tokenizer
        self._max = max_decoders
        self._decoders: dict[int, Decoder] = {}

    def __len__(self) -> int:
        return len(self._decoders)

    def get(self, decoder_id: int, spec: p.DecoderSpec | None) -> Decoder:
        """Decoder ``decoder_id``, made from ``spec`` if it is new; ItemFailure (bad_argument) for an
        unknown id without a spec, a full table, a bad penalty or a grammar that does not compile."""
        decoder = self._decoders.get(decoder_id)
        if decoder is not None:
            return decoder
        if spec is None:
            raise ItemFailure(p.ERR_BAD_ARGUMENT, f"decoder {decoder_id} is unknown here (never sent with its "
                                                  "spec, dropped, or lost with an earlier inference process)")
        if len(self._decoders) >= self._max:
            raise ItemFailure(p.ERR_BAD_ARGUMENT, f"this connection already holds {self._max} decoders (drop some)")
        if (problem := g.penalty_problem(spec.presence, spec.frequency, spec.repetition)) is not None:
            raise ItemFailure(p.ERR_BAD_ARGUMENT, problem)
        matcher = None
        if spec.grammar:
            matcher = g.matcher(spec.grammar, self._llg_tokenizer())
            if matcher.is_error():
                raise ItemFailure(p.ERR_BAD_ARGUMENT, f"grammar: {matcher.get_error()}")
        decoder = self._decoders[decoder_id] = Decoder(spec, matcher)
        return decoder

    def drop(self, decoder_ids: list[int]) -> None:
        for decoder_id in decoder_ids:
            self._decoders.pop(decoder_id, None)
