"""Pipelined generation: the server draws each token (``forward-sample``), and the next step is
issued with that token's future as its input before the token is known, so the device need not
wait for this inferlet between two steps (xLLM's asynchronous schedule).

It gives what ``Context.generate_tokens`` gives, token for token, and leaves the context as that
loop does: the server runs the SDK's own sampler on the distribution the inferlet would have got
(sdk/README.md "Seeded sampling"), with the generator state the sampler would have, and every host
call of the step-by-step loop (page reservations, prefetches) is made at the same point. A step is
issued ahead only when it needs no new page; otherwise it waits for the token, as that loop does.
When the token a step ahead feeds on ends generation, the step is dropped: its future is
discarded and the context forgets the token it fed, which stays pending, as in the other loop.
The K/V that step wrote lies past the context's end, in the slot where the next forward of that
pending token writes the very same values.
"""

from __future__ import annotations

from wit_world.imports import forward, futures

from . import host
from .sampling import Greedy, Rng, Sampler, server_spec
from .shaping import Decoder, Shape, logprobs_of, wit_shaping
from .stop import Stop
from .tasks import HostFuture

_GAMMA = 0x9E3779B97F4A7C15  # SplitMix64's increment: each draw adds it to the state
_MASK64 = (1 << 64) - 1
_KIND = {"greedy": forward.SamplerKind.GREEDY, "temperature": forward.SamplerKind.TEMPERATURE,
         "top-k": forward.SamplerKind.TOP_K, "top-p": forward.SamplerKind.TOP_P, "min-p": forward.SamplerKind.MIN_P}


class Pipelined:
    """``Context``'s generation loop with one server-sampled step in flight ahead."""

    async def _generate_pipelined(self, sampler: Sampler, stop: Stop, spec: tuple[str, float, float],
                                  shape: Shape | None = None) -> list[int]:
        decoder = Decoder(shape) if shape is not None and shape.needs_decoder() else None
        try:
            self._shaping = None if shape is None else (wit_shaping(shape, decoder, host.vocab_size()),
                                                        shape.logprobs >= 0)
            return await self._generate_steps(sampler, stop, spec)
        finally:
            self._shaping = None
            if decoder is not None:
                decoder.drop()

    async def _generate_steps(self, sampler: Sampler, stop: Stop, spec: tuple[str, float, float]) -> list[int]:
        stop_ids = stop.stop_token_ids(host.stop_tokens())
        limit, strings, tail = stop.max_tokens, stop.strings, stop.tail_tokens()
        rng: Rng | None = getattr(sampler, "rng", None)
        draw_step = 0 if rng is None else _GAMMA  # one draw per sample, none for Greedy
        first_state = 0 if rng is None else rng.state
        sample = (_KIND[spec[0]], spec[1], spec[2], sampler.top_k)
        generated: list[int] = []
        self.generated, self._planned_len = generated, len(self) + limit
        try:
            if limit <= 0:
                return generated
            step = await self._issue_first(sample, first_state)
            while True:
                ahead = None
                if len(generated) + 1 < limit and not self._needs_pages(len(self.tokens) + 1):
                    state = (first_state + (len(generated) + 1) * draw_step) & _MASK64
                    ahead = self._issue_sample(1, step, sample, state)
                token = await step
                generated.append(token)
                stopping = (token in stop_ids or len(generated) >= limit
                            or bool(strings) and stop.find_string(host.decode(generated[-tail:])) is not None)
                if ahead is not None and stopping:
                    futures.discard(ahead.handle)
                    self.tokens.pop()  # the token the dropped step fed: pending again
                    self.pending.append(token)
                    break
                if ahead is not None:
                    self.tokens[-1] = token
                    step = ahead
                else:
                    self.pending.append(token)
                    if stopping:
                        break
                    end = len(self.tokens) + 1
                    if self._needs_pages(end):
                        await self._reserve(end)
                    step = self._issue_sample(1, None, sample, (first_state + len(generated) * draw_step) & _MASK64)
                self._prefetch_after_decode(True)
        finally:
            self._planned_len = 0
            if rng is not None:  # the draws of the tokens generated, as if the inferlet had sampled them
                rng.state = (first_state + len(generated) * draw_step) & _MASK64
        return generated

    async def _issue_first(self, sample: tuple, rng_state: int) -> HostFuture:
        """The first step of a server-drawn generation: every pending token (the last one again if none
        is), pages reserved. Pages the server discarded while the inferlet waited are rewritten first
        (recompute.py): a step that failed on one could not be retried once the next is issued on its token."""
        await self._recompute_discarded()
        self._feed_last_again()
        end = len(self.tokens) + len(self.pending)
        if self._needs_pages(end):
            await self._reserve(end)
        one = len(self.pending) == 1
        step = self._issue_sample(len(self.pending), None, sample, rng_state)
        self._prefetch_after_decode(one)
        return step

    def _issue_sample(self, count: int, feeds: HostFuture | None, sample: tuple, rng_state: int) -> HostFuture:
        """The ``forward-sample`` call for the first ``count`` pending tokens (pages reserved), or, given
        ``feeds``, for the one token that future will hold: the context holds a placeholder for it
        until it is known."""
        start = len(self.tokens)
        if feeds is None:
            tokens, inputs = self.pending[:count], []
            self.tokens += tokens
            self.pending = self.pending[count:]
        else:
            tokens, inputs = [0], [feeds.handle]
            self.tokens.append(-1)
        end = start + count
        used = -(-end // self.page_size)
        positions = [start] if count == 1 else list(range(start, end))
        kind, temperature, param, top_k = sample
        args = (self.queue.id, tokens, inputs, positions, self.pages.handles[:used], end - (used - 1) * self.page_size,
                top_k, self.adapter, kind, temperature, param, rng_state)
        if self._shaping is None:
            return self.queue.result(forward.forward_sample(*args), futures.take_token)
        shaping, keep_logprobs = self._shaping
        return self.queue.result(forward.forward_sample_shaped(*args, shaping),
                                 self._take_logprobs if keep_logprobs else _take_sampled_token)

    def _take_logprobs(self, handle: int) -> int:
        """A shaped step's token; its log-probabilities go to ``self.logprobs`` (steps complete in order,
        and a step dropped ahead is never taken)."""
        record = logprobs_of(futures.take_sampled(handle))
        self.logprobs.append(record)
        return record.token

    async def shaped_step(self, shape: Shape, sampler: Sampler | None = None) -> int:
        """One step that the server draws under ``shape``, for a custom decoder that changes the mask or
        the biases from step to step (a decoder's grammar and penalties need ``generate``); the token
        is filled, as ``decode_step`` does, and its log-probabilities appended to ``self.logprobs``
        when ``shape.logprobs`` >= 0."""
        sampler = sampler or Greedy()
        spec = server_spec(sampler)
        if spec is None or shape.needs_decoder():
            raise ValueError("shaped_step takes a built-in sampler and a Shape without grammar or penalties")
        rng: Rng | None = getattr(sampler, "rng", None)
        self._shaping = (wit_shaping(shape, None, host.vocab_size()), shape.logprobs >= 0)
        try:
            step = await self._issue_first((_KIND[spec[0]], spec[1], spec[2], sampler.top_k),
                                           0 if rng is None else rng.state)
            token = await step
        finally:
            self._shaping = None
        if rng is not None:
            rng.state = (rng.state + _GAMMA) & _MASK64
        self.pending.append(token)
        return token


def _take_sampled_token(handle: int) -> int:
    return futures.take_sampled(handle).token
