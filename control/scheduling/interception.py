"""What to do with the KV of an intercepted context: InferCept's preserve / swap / discard, per iteration.

A context is *intercepted* while its inferlet waits on something outside the
model (a tool call, an HTTP fetch, a client message, a timer) or declared a
pause. Keeping its pages on the device (*preserve*) wastes them for as long as
the interception lasts; *discard* frees them but the context must be
recomputed when it returns, which holds its own pages and those of every
running context the recompute delays; *swap* moves them to the host tier and
back, which costs transfer time but nothing else while the copies stay within
a per-iteration budget that hides them behind the device step.

Waste is memory x time, in page-seconds (InferCept §3):

* preserve = pages x expected remaining time of the interception;
* discard = recompute time x (its pages + the pages of the running contexts it delays),
  recompute time from the profiled model ``a * n**2 + b * n`` seconds for ``n`` tokens;
* swap = pages x transfer time out and back in (``2 * pages * swap_s_per_page``) where the copies
  overlap the device step (CUDA: a side stream); where they cannot (a CPU runs them between two
  steps), the running contexts wait for them too: transfer time x (its pages + the running pages).

Every iteration :func:`decide` sorts the intercepted contexts on the device by
``min(preserve, discard)`` descending, swaps out in that order within the swap
budget (those whose swap would waste more than preserving them excepted: they
return before the copies could pay off), and preserves or discards the rest,
whichever wastes less. Contexts
that cannot be recomputed (their pages hold non-text embeds, whose inputs the
control layer does not keep, or their inferlet never said it can rewrite them)
are never discarded. Swapped-out contexts are swapped back
in ahead of their expected return, oldest arrival first (FCFS), within the same
budget. The policy is pure: the clock comes in as ``now``.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

INFERCEPT = "infercept"
PRESERVE_ALL = "preserve"
DISCARD_ALL = "discard"
SWAP_ALL = "swap"
NAMES = (INFERCEPT, PRESERVE_ALL, DISCARD_ALL, SWAP_ALL)


class Action(enum.Enum):
    PRESERVE = "preserve"  # pages stay on the device
    SWAP_OUT = "swap-out"  # copy pages to the host tier this iteration
    DISCARD = "discard"  # free the pages; recompute the context when it returns
    STAY_SWAPPED = "stay-swapped"  # on the host tier, not due back yet (or no budget left this iteration)
    SWAP_IN = "swap-in"  # copy pages back this iteration: the context returns soon (or has)


class Location(enum.Enum):
    DEVICE = "device"
    HOST = "host"


@dataclass(frozen=True, slots=True)
class InterceptionPolicy:
    """One of :data:`NAMES`: ``infercept`` minimises waste; the others are InferCept's baselines
    (``swap`` swaps every context at once, ignoring the budget, as the baseline does)."""

    name: str = INFERCEPT

    def __post_init__(self):
        if self.name not in NAMES:
            raise ValueError(f"unknown interception policy {self.name!r}; expected one of {', '.join(NAMES)}")


@dataclass(frozen=True, slots=True)
class CostProfile:
    """Costs measured on the served model and device.

    ``recompute_a_s`` / ``recompute_b_s``: prefill of ``n`` tokens takes ``a * n**2 + b * n``
    seconds; ``swap_s_per_page``: one page copied one way; ``swap_budget_pages``: pages that
    may be copied (either way) per iteration without lengthening the device step;
    ``copies_overlap``: whether copies run beside the device step (else they hold it up).
    """

    recompute_a_s: float
    recompute_b_s: float
    swap_s_per_page: float
    swap_budget_pages: int
    copies_overlap: bool = True

    def __post_init__(self):
        if min(self.recompute_a_s, self.recompute_b_s, self.swap_s_per_page, self.swap_budget_pages) < 0:
            raise ValueError(f"costs must not be negative: {self}")

    def recompute_s(self, num_tokens: int) -> float:
        return self.recompute_a_s * num_tokens * num_tokens + self.recompute_b_s * num_tokens


@dataclass(frozen=True, slots=True)
class InterceptedContext:
    """One paused context. ``expected_return_at``: when the interception should end (same clock as
    ``now``; at or before ``now`` once it has); ``arrival``: its request's original arrival."""

    context_id: Hashable
    arrival: float
    num_pages: int
    num_tokens: int
    expected_return_at: float
    location: Location = Location.DEVICE
    recomputable: bool = True  # False: its pages hold non-text embeds, or its inferlet cannot rewrite them


@dataclass(frozen=True, slots=True)
class Choice:
    """The action for one context, and the waste (page-seconds) each option would cost it."""

    context_id: Hashable
    action: Action
    waste_preserve: float
    waste_discard: float
    waste_swap: float


def wastes(ctx: InterceptedContext, profile: CostProfile, now: float, running_pages: int) -> tuple[float, float, float]:
    """(preserve, discard, swap) waste of ``ctx`` in page-seconds; discard is infinite for a context that
    cannot be recomputed."""
    remaining_s = max(0.0, ctx.expected_return_at - now)
    preserve = ctx.num_pages * remaining_s
    discard = (float("inf") if not ctx.recomputable
               else profile.recompute_s(ctx.num_tokens) * (ctx.num_pages + running_pages))
    held_up = ctx.num_pages + (0 if profile.copies_overlap else running_pages)
    swap = 2 * ctx.num_pages * profile.swap_s_per_page * held_up
    return preserve, discard, swap


def decide(policy: InterceptionPolicy, contexts: Sequence[InterceptedContext], profile: CostProfile, now: float,
           running_pages: int = 0) -> list[Choice]:
    """One iteration's choices: swap-ins first (FCFS by arrival), then the contexts on the device by
    waste, largest first. ``running_pages``: pages of the contexts running now (a recompute delays them).
    """
    full_budget = profile.swap_budget_pages if policy.name == INFERCEPT else float("inf")
    budget, blocked = full_budget, False
    choices = []
    for ctx in sorted((c for c in contexts if c.location is Location.HOST), key=lambda c: c.arrival):
        lead_s = ctx.num_pages * profile.swap_s_per_page  # start the copy back this long before the return
        due = ctx.expected_return_at - lead_s <= now
        # FCFS: once an older context waits for budget, no newer one overtakes it; a context larger
        # than the whole budget still goes when it is first in line (else it would never come back).
        if due and not blocked and (ctx.num_pages <= budget or budget == full_budget):
            budget -= ctx.num_pages
            action = Action.SWAP_IN
        else:
            blocked = blocked or due
            action = Action.STAY_SWAPPED
        choices.append(Choice(ctx.context_id, action, *wastes(ctx, profile, now, running_pages)))
    on_device = [(c, wastes(c, profile, now, running_pages)) for c in contexts if c.location is Location.DEVICE]
    on_device.sort(key=lambda item: (-min(item[1][0], item[1][1]), item[0].arrival))
    for ctx, (preserve, discard, swap) in on_device:
        action = _device_action(policy, ctx, preserve, discard, swap, budget)
        if action is Action.SWAP_OUT:
            budget -= ctx.num_pages
        choices.append(Choice(ctx.context_id, action, preserve, discard, swap))
    return choices


def _device_action(policy: InterceptionPolicy, ctx: InterceptedContext, preserve: float, discard: float,
                   swap: float, budget: float) -> Action:
    if policy.name == PRESERVE_ALL:
        return Action.PRESERVE
    if policy.name == DISCARD_ALL:
        return Action.DISCARD if ctx.recomputable else Action.PRESERVE
    if policy.name == SWAP_ALL:
        return Action.SWAP_OUT
    # A context back before its pages could go out and in again gains nothing from the copies.
    if ctx.num_pages <= budget and swap < preserve:
        return Action.SWAP_OUT
    return Action.DISCARD if discard < preserve else Action.PRESERVE
