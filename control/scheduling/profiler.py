"""The interception policy's costs, learnt from the batches the served model answers (first use, then on).

The control layer times every batch from send to reply. Forward batches give
the seconds per token of a recompute (``b``; ``a``, the quadratic attention
term, is not separable from batch timings and stays 0, which undercounts long
recomputes only), offload and restore batches the seconds per page copied,
and the device step (the mean forward batch) the swap budget: the pages whose
copies fit in one step. Until a kind of batch has been seen, the defaults
below stand in. Pure: times come in as arguments.
"""

from __future__ import annotations

from .interception import CostProfile

FORWARD_CALL_TYPES = frozenset({"forward", "forward_text"})
COPY_CALL_TYPES = frozenset({"offload", "restore"})
ALPHA = 0.1  # weight of the newest batch in the running means
# Before any measurement: a CPU-sized guess (SmolLM2 on 2 cores: ~1 ms per prefill token, a page copy
# well under 1 ms), so decisions start sensible and are corrected by the first batches.
DEFAULT = CostProfile(recompute_a_s=0.0, recompute_b_s=1e-3, swap_s_per_page=2e-4, swap_budget_pages=64)


class CostProfiler:
    """``copies_overlap``: whether the served device copies beside its steps (CUDA's side stream)."""

    def __init__(self, default: CostProfile = DEFAULT, copies_overlap: bool = True):
        self._default, self._copies_overlap = default, copies_overlap
        self._s_per_token: float | None = None
        self._s_per_page: float | None = None
        self._step_s: float | None = None

    def observe(self, call_type: str, num_items: int, num_tokens: int, seconds: float) -> None:
        """One answered batch: its call type, items, tokens and seconds from send to reply."""
        if seconds <= 0 or num_items <= 0:
            return
        if call_type in FORWARD_CALL_TYPES:
            self._step_s = _mean(self._step_s, seconds)
            if num_tokens > num_items:  # a prefill: what recomputing costs per token
                self._s_per_token = _mean(self._s_per_token, seconds / num_tokens)
        elif call_type in COPY_CALL_TYPES:
            self._s_per_page = _mean(self._s_per_page, seconds / num_items)

    @property
    def measured(self) -> tuple[bool, bool, bool]:
        """Whether the recompute cost, the swap cost and the swap budget are measured (not defaults)."""
        return self._s_per_token is not None, self._s_per_page is not None, self._step_s is not None

    def profile(self) -> CostProfile:
        d = self._default
        per_page = d.swap_s_per_page if self._s_per_page is None else self._s_per_page
        budget = d.swap_budget_pages if self._step_s is None else max(1, int(self._step_s / max(per_page, 1e-9)))
        return CostProfile(d.recompute_a_s, d.recompute_b_s if self._s_per_token is None else self._s_per_token,
                           per_page, budget, self._copies_overlap)


def _mean(old: float | None, new: float) -> float:
    return new if old is None else (1 - ALPHA) * old + ALPHA * new
