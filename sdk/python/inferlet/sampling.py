"""Samplers over the top-K next-token distribution the host returns (most probable first).

Probabilities come from the full softmax; temperature and the truncations are applied to
the top K the sampler asks for (``top_k``), which holds all but a negligible tail when K is
in the hundreds. Every random sampler takes a seed, so a run can be repeated exactly.
"""

from __future__ import annotations

import random


class Sampler:
    top_k = 0  # how many candidates to ask the host for; 0 = the server's default

    def sample(self, token_ids: list[int], probs: list[float]) -> int:
        raise NotImplementedError


class Greedy(Sampler):
    top_k = 1

    def sample(self, token_ids, probs):
        return token_ids[0]


class Temperature(Sampler):
    """Sample from p^(1/temperature), renormalised, after the subclass's truncation."""

    def __init__(self, temperature: float = 1.0, seed: int | None = None):
        if temperature <= 0:
            raise ValueError("temperature must be > 0 (use Greedy for argmax)")
        self.temperature, self.rng = temperature, random.Random(seed)

    def keep(self, probs: list[float]) -> int:
        """How many of the (sorted) candidates survive truncation."""
        return len(probs)

    def sample(self, token_ids, probs):
        n = max(1, self.keep(probs))
        weights = [p ** (1.0 / self.temperature) for p in probs[:n]]
        return self.rng.choices(token_ids[:n], weights)[0]


class TopK(Temperature):
    def __init__(self, k: int, temperature: float = 1.0, seed: int | None = None):
        super().__init__(temperature, seed)
        self.k = self.top_k = k

    def keep(self, probs):
        return min(self.k, len(probs))


class TopP(Temperature):
    """Nucleus sampling: the smallest prefix whose probability reaches ``p``."""

    def __init__(self, p: float, temperature: float = 1.0, seed: int | None = None):
        super().__init__(temperature, seed)
        self.p = p

    def keep(self, probs):
        total = 0.0
        for i, prob in enumerate(probs):
            total += prob
            if total >= self.p:
                return i + 1
        return len(probs)


class MinP(Temperature):
    """Candidates at least ``p`` times as likely as the most likely one."""

    def __init__(self, p: float, temperature: float = 1.0, seed: int | None = None):
        super().__init__(temperature, seed)
        self.p = p

    def keep(self, probs):
        floor = self.p * probs[0]
        return sum(1 for prob in probs if prob >= floor)
