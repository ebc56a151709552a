"""Emulated execution times matching the AsyncLM evaluation (§6, "Workloads").

The paper measured each BFCL function's execution time between 30 ms and 500 ms,
110 ms on average, without giving the shape. We use a shifted exponential clipped
at the top — ``30 + min(Exp(scale), 470)`` ms — because service latencies are
right-skewed (most calls fast, a long tail). The scale is solved so that the
clipped mean is exactly 110 ms: ``E[min(X, c)] = scale * (1 - exp(-c / scale))``.

Times are fixed per function name, drawn from a generator seeded with
``(seed, name)``: a function takes the same time on every call, so the estimate
announced in the prompt is the time it really takes, and two runs with one seed
agree.
"""

from __future__ import annotations

import math
import random

from .call import ToolError, parse_call

__all__ = ["MIN_MS", "MAX_MS", "MEAN_MS", "PaperLatency", "paper_latency"]

MIN_MS = 30.0
MAX_MS = 500.0
MEAN_MS = 110.0


def _exponential_scale_ms() -> float:
    # Fixed point of scale = (MEAN - MIN) / (1 - exp(-(MAX - MIN) / scale)); it
    # contracts fast because the clipped tail holds well under 1% of the mass.
    excess_ms, span_ms = MEAN_MS - MIN_MS, MAX_MS - MIN_MS
    scale_ms = excess_ms
    for _ in range(50):
        scale_ms = excess_ms / (1.0 - math.exp(-span_ms / scale_ms))
    return scale_ms


_SCALE_MS = _exponential_scale_ms()


class PaperLatency:
    """``latency(call_text) -> seconds``: the called function's emulated execution time.

    Use it as a :class:`~.executor.ToolExecutor`'s ``latency``; :meth:`function_ms`
    gives the same time by function name, for the prompt's estimates. A call text
    that does not parse costs 0 s (it fails at once).
    """

    def __init__(self, seed: int = 0):
        self.seed = seed
        self._ms_by_name: dict[str, float] = {}

    def __call__(self, call_text: str) -> float:
        try:
            name = parse_call(call_text).name
        except ToolError:
            return 0.0
        return self.function_ms(name) / 1000.0

    def function_ms(self, name: str) -> float:
        """The execution time in milliseconds of every call of function ``name``."""
        if name not in self._ms_by_name:
            # A str seed is hashed with SHA-512 by random.Random: stable across processes.
            rng = random.Random(f"{self.seed}:{name}")
            excess_ms = min(rng.expovariate(1.0 / _SCALE_MS), MAX_MS - MIN_MS)
            self._ms_by_name[name] = MIN_MS + excess_ms
        return self._ms_by_name[name]


def paper_latency(seed: int = 0) -> PaperLatency:
    """Per-function execution times in 30–500 ms with a 110 ms mean, fixed by ``seed``."""
    return PaperLatency(seed)
