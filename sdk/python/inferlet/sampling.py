"""Samplers over the top-K next-token distribution the host returns (most probable first), and the
seeded generator they draw from.

The algorithm is the one the Rust SDK runs (``sdk/rust/oven/src/sampling.rs``), operation for
operation, so that a seed gives the same tokens in both SDKs; ``sdk/README.md`` ("Seeded sampling")
specifies it, with test vectors. Every step is an IEEE-754 binary64 operation (+, -, *, /, floor,
comparisons, scaling by a power of two), all exactly rounded, so the result does not depend on the
platform's math library: ``_weights`` computes ``x ** a`` from its own series rather than ``pow``.
"""

from __future__ import annotations

from bisect import bisect_right
from itertools import accumulate
from math import floor, frexp, ldexp

_MASK64 = (1 << 64) - 1
_LN2 = 0.6931471805599453


class Rng:
    """SplitMix64 (Steele, Lea and Flood 2014): a 64-bit state, seeded with ``seed`` mod 2**64."""

    __slots__ = ("state",)

    def __init__(self, seed: int = 0):
        self.state = seed & _MASK64

    def next_u64(self) -> int:
        self.state = z = (self.state + 0x9E3779B97F4A7C15) & _MASK64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        return z ^ (z >> 31)

    def next_f64(self) -> float:
        """Uniform in [0, 1): the top 53 bits of ``next_u64`` times 2**-53 (exact)."""
        return (self.next_u64() >> 11) * 1.1102230246251565e-16


def _weights(probs: list[float], top: float, a: float) -> list[float]:
    """``(p / top) ** a`` for each p (0 <= p <= top, a >= 0), as every SDK computes it (sdk/README.md,
    "weight"): 1 at 1 or above; 0 below 2**-1022; else exp(a * ln(p / top)), ln from the atanh series
    and exp from the Taylor series, each Horner loop written out with its coefficients (L_10..L_0 and
    E_14..E_0 of the spec): three times faster in CPython than looping over them."""
    out = []
    for p in probs:
        x = p / top
        if x >= 1.0:
            out.append(1.0)
            continue
        if x < 2.2250738585072014e-308:
            out.append(0.0)
            continue
        m, e = frexp(x)  # x = m * 2**e, 0.5 <= m < 1
        if m < 0.7071067811865476:
            m, e = m * 2.0, e - 1
        s = (m - 1.0) / (m + 1.0)
        z = s * s
        y = a * (e * _LN2 + 2.0 * s * ((((((((((
            0.047619047619047616 * z + 0.05263157894736842) * z + 0.058823529411764705) * z
            + 0.06666666666666667) * z + 0.07692307692307693) * z + 0.09090909090909091) * z
            + 0.1111111111111111) * z + 0.14285714285714285) * z + 0.2) * z + 0.3333333333333333) * z + 1.0))
        if y < -708.0:  # the result would leave the normal range
            out.append(0.0)
            continue
        k = floor(y / _LN2 + 0.5)
        r = y - k * _LN2
        out.append(ldexp((((((((((((((
            1.1470745597729726e-11 * r + 1.6059043836821616e-10) * r + 2.08767569878681e-09) * r
            + 2.505210838544172e-08) * r + 2.7557319223985894e-07) * r + 2.7557319223985893e-06) * r
            + 2.48015873015873e-05) * r + 0.0001984126984126984) * r + 0.001388888888888889) * r
            + 0.008333333333333333) * r + 0.041666666666666664) * r + 0.16666666666666666) * r + 0.5) * r
            + 1.0) * r + 1.0, k))  # times 2**k, exactly: -1021 <= k <= 0
    return out


def draw(probs: list[float], n: int, temperature: float, rng: Rng) -> int:
    """The index of one of the first ``n`` candidates, drawn with weight (probs[i] / probs[0]) ** (1 /
    temperature); one ``next_f64`` per call, whatever the case; temperature 0 (or one candidate) is
    the most probable."""
    u = rng.next_f64()
    n = min(max(n, 1), len(probs))
    top = probs[0]
    if n == 1 or temperature == 0.0 or not top > 0.0:
        return 0
    if temperature == 1.0:
        weights = [p / top for p in probs[:n]]
    else:
        weights = _weights(probs[:n], top, 1.0 / temperature)
    cumulative = list(accumulate(weights))  # left to right, each sum rounded: not math.fsum, not sum()
    return min(bisect_right(cumulative, u * cumulative[-1]), n - 1)


class Sampler:
    """Picks the next token from a top-K distribution. A custom sampler sets ``top_k`` (how many
    candidates to ask the host for; 0 = the server's default) and defines ``sample``."""

    top_k = 0

    def sample(self, token_ids: list[int], probs: list[float]) -> int:
        raise NotImplementedError


class Greedy(Sampler):
    """The most probable token (draws nothing)."""

    top_k = 1

    def sample(self, token_ids, probs):
        return token_ids[0]


class Temperature(Sampler):
    """Every candidate returned, with weight p ** (1 / temperature); temperature 0 is greedy. The
    subclasses keep fewer candidates first (``keep``), judged on the probabilities as returned."""

    def __init__(self, temperature: float = 1.0, seed: int = 0):
        if not temperature >= 0.0:
            raise ValueError("temperature must be >= 0 (0 samples greedily)")
        self.temperature, self.rng = float(temperature), Rng(seed)

    def keep(self, probs: list[float]) -> int:
        """How many of the (sorted) candidates survive truncation."""
        return len(probs)

    def sample(self, token_ids, probs):
        return token_ids[draw(probs, self.keep(probs), self.temperature, self.rng)]


class TopK(Temperature):
    """The ``k`` most probable tokens (the host is asked for exactly ``k``)."""

    def __init__(self, k: int, temperature: float = 1.0, seed: int = 0):
        if k < 1:
            raise ValueError("k must be at least 1")
        super().__init__(temperature, seed)
        self.k = self.top_k = k

    def keep(self, probs):
        return min(self.k, len(probs))


class TopP(Temperature):
    """Nucleus sampling: the fewest most probable tokens whose probabilities (summed in order, as
    the full softmax gave them) reach ``p``; all of them if they never do."""

    def __init__(self, p: float, temperature: float = 1.0, seed: int = 0):
        if not 0.0 < p <= 1.0:
            raise ValueError("p must be in (0, 1]")
        super().__init__(temperature, seed)
        self.p = float(p)

    def keep(self, probs):
        total = 0.0
        for i, prob in enumerate(probs):
            total += prob
            if total >= self.p:
                return i + 1
        return len(probs)


class MinP(Temperature):
    """The tokens at least ``p`` times as probable as the most probable one."""

    def __init__(self, p: float, temperature: float = 1.0, seed: int = 0):
        if not 0.0 <= p <= 1.0:
            raise ValueError("p must be in [0, 1]")
        super().__init__(temperature, seed)
        self.p = float(p)

    def keep(self, probs):
        floor_ = self.p * probs[0]
        n = 0
        while n < len(probs) and probs[n] >= floor_:
            n += 1
        return n


def server_spec(sampler: Sampler) -> tuple[str, float, float] | None:
    """(kind, temperature, param) of a built-in sampler that the server can run in its place with the
    same draws (WIT ``forward-sample``; ``param`` is TopK's k, TopP's or MinP's p), or None for any
    other sampler: a subclass may sample differently, and only the inferlet can run it."""
    kind = type(sampler)
    if kind is Greedy:
        return "greedy", 0.0, 0.0
    if kind is Temperature:
        return "temperature", sampler.temperature, 0.0
    if kind is TopK:
        return "top-k", sampler.temperature, float(sampler.k)
    if kind is TopP:
        return "top-p", sampler.temperature, sampler.p
    if kind is MinP:
        return "min-p", sampler.temperature, sampler.p
    return None
