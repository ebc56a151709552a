"""The interception policy (control/scheduling/interception.py) on hand-made pools, clock passed in."""

from __future__ import annotations

import pytest

from oven.control.scheduling.interception import (Action, Choice, CostProfile, InterceptedContext, InterceptionPolicy,
                                                  Location, decide, wastes)
from oven.control.scheduling.profiler import DEFAULT, CostProfiler

# recompute of n tokens: 1e-6 n^2 + 1e-3 n s (100 tokens: 0.11 s); a page copy 0.01 s; 4 pages per iteration
PROFILE = CostProfile(recompute_a_s=1e-6, recompute_b_s=1e-3, swap_s_per_page=0.01, swap_budget_pages=4)


def ctx(name, arrival, pages, tokens, returns_at, location=Location.DEVICE, embeds=False) -> InterceptedContext:
    return InterceptedContext(name, arrival, pages, tokens, returns_at, location, recomputable=not embeds)


def actions(choices: list[Choice]) -> list[tuple[str, Action]]:
    return [(c.context_id, c.action) for c in choices]


def test_wastes_follow_infercepts_definitions():
    c = ctx("a", 0.0, 2, 100, returns_at=13.0)
    preserve, discard, swap = wastes(c, PROFILE, now=10.0, running_pages=8)
    assert preserve == pytest.approx(2 * 3.0)  # pages x remaining seconds
    assert discard == pytest.approx((1e-6 * 100**2 + 1e-3 * 100) * (2 + 8))  # recompute x pages it holds up
    assert swap == pytest.approx(2 * 2 * 2 * 0.01)  # pages x (out + in) transfer time
    assert wastes(ctx("e", 0.0, 2, 100, 13.0, embeds=True), PROFILE, 10.0, 8)[1] == float("inf")
    assert wastes(c, PROFILE, now=20.0, running_pages=0)[0] == 0.0  # overdue: nothing left to waste


def test_where_copies_run_between_steps_a_swap_holds_the_running_pages_up_too():
    between = CostProfile(1e-6, 1e-3, 0.01, swap_budget_pages=4, copies_overlap=False)
    c = ctx("a", 0.0, 2, 100, returns_at=10.5)
    assert wastes(c, between, now=10.0, running_pages=8)[2] == pytest.approx(2 * 2 * 0.01 * (2 + 8))
    # back in 0.5 s: preserving wastes 1 page-s, discarding 0.11 s x 50 pages; swapping 0.04 s of copies
    # x 2 pages = 0.08 where they hide behind the step, but x 50 = 2.0 where the 48 running pages wait too
    assert actions(decide(InterceptionPolicy("infercept"), [c], PROFILE, 10.0, running_pages=48)) == [
        ("a", Action.SWAP_OUT)]
    assert actions(decide(InterceptionPolicy("infercept"), [c], between, 10.0, running_pages=48)) == [
        ("a", Action.PRESERVE)]


def test_infercept_swaps_the_biggest_wasters_within_the_budget_then_picks_the_smaller_waste():
    pool = [
        ctx("long-tool", 0.0, 3, 40, returns_at=60.0),  # preserve 150, discard 0.1248: min 0.12
        ctx("huge-context", 1.0, 3, 2000, returns_at=12.0),  # preserve 6, discard 18: min 6
        ctx("short-call", 2.0, 2, 30, returns_at=10.5),  # preserve 1, discard 0.0618: min 0.06
        ctx("embed-context", 3.0, 2, 30, returns_at=30.0, embeds=True),  # preserve 40, never discarded: min 40
    ]
    choices = decide(InterceptionPolicy("infercept"), pool, PROFILE, now=10.0)
    # sorted by min(preserve, discard), largest first; 4 pages of budget: "embed-context" (2) is swapped,
    # "huge-context" (3) does not fit in the 2 left, "long-tool" (3) neither, "short-call" (2) does
    assert actions(choices) == [("embed-context", Action.SWAP_OUT), ("huge-context", Action.PRESERVE),
                                ("long-tool", Action.DISCARD), ("short-call", Action.SWAP_OUT)]


def test_infercept_never_discards_embeds_and_keeps_a_context_due_back_now():
    no_budget = CostProfile(1e-6, 1e-3, 0.01, swap_budget_pages=0)
    pool = [ctx("embeds", 0.0, 2, 30, returns_at=50.0, embeds=True), ctx("back", 1.0, 2, 30, returns_at=10.0)]
    assert actions(decide(InterceptionPolicy("infercept"), pool, no_budget, now=10.0)) == [
        ("embeds", Action.PRESERVE), ("back", Action.PRESERVE)]


def test_a_context_back_before_its_copies_would_pay_off_stays():
    # back in 10 ms: preserving 2 pages wastes 0.02 page-s, swapping them out and in 0.08
    soon = ctx("soon", 0.0, 2, 30, returns_at=10.01)
    assert actions(decide(InterceptionPolicy("infercept"), [soon], PROFILE, now=10.0)) == [("soon", Action.PRESERVE)]


def test_swap_ins_go_first_fcfs_ahead_of_the_expected_return_within_the_budget():
    pool = [
        ctx("late", 5.0, 2, 30, returns_at=10.01, location=Location.HOST),  # due: 10.01 - 0.02 <= 10
        ctx("early", 1.0, 3, 30, returns_at=9.0, location=Location.HOST),  # returned already
        ctx("later", 0.5, 1, 30, returns_at=11.0, location=Location.HOST),  # not due before 10.99
        ctx("paused", 2.0, 2, 30, returns_at=40.0),
    ]
    choices = decide(InterceptionPolicy("infercept"), pool, PROFILE, now=10.0)
    # "early" (3 pages) goes first by arrival; "late" (2) would overrun the budget and waits; the budget
    # left (1 page) is too small to swap "paused" out, so it is preserved or discarded by waste
    assert actions(choices) == [("later", Action.STAY_SWAPPED), ("early", Action.SWAP_IN),
                                ("late", Action.STAY_SWAPPED), ("paused", Action.DISCARD)]


def test_a_context_larger_than_the_budget_still_comes_back_when_first_in_line():
    pool = [ctx("big", 0.0, 9, 100, returns_at=0.0, location=Location.HOST),
            ctx("small", 1.0, 1, 10, returns_at=0.0, location=Location.HOST)]
    assert actions(decide(InterceptionPolicy("infercept"), pool, PROFILE, now=1.0)) == [
        ("big", Action.SWAP_IN), ("small", Action.STAY_SWAPPED)]


def test_the_baselines():
    pool = [ctx("a", 0.0, 3, 40, returns_at=60.0), ctx("b", 1.0, 3, 40, returns_at=60.0),
            ctx("e", 2.0, 3, 40, returns_at=60.0, embeds=True)]
    assert {c.action for c in decide(InterceptionPolicy("preserve"), pool, PROFILE, now=0.0)} == {Action.PRESERVE}
    assert actions(decide(InterceptionPolicy("discard"), pool, PROFILE, now=0.0)) == [
        ("e", Action.PRESERVE), ("a", Action.DISCARD), ("b", Action.DISCARD)]
    # the swap baseline ignores the budget (9 pages against 4): every context goes at once
    assert {c.action for c in decide(InterceptionPolicy("swap"), pool, PROFILE, now=0.0)} == {Action.SWAP_OUT}


def test_policy_names_and_profile_validation():
    assert InterceptionPolicy() == InterceptionPolicy("infercept")
    with pytest.raises(ValueError, match="unknown interception policy 'lru'"):
        InterceptionPolicy("lru")
    with pytest.raises(ValueError, match="costs must not be negative"):
        CostProfile(1e-6, 1e-3, -0.01, 4)


def test_the_profiler_learns_costs_from_answered_batches():
    profiler = CostProfiler()
    assert profiler.profile() == DEFAULT  # nothing measured yet
    profiler.observe("forward_text", num_items=4, num_tokens=64, seconds=0.064)  # a prefill: 1 ms a token
    profiler.observe("offload", num_items=8, num_tokens=8, seconds=0.004)  # 0.5 ms a page
    profiler.observe("forward_text", num_items=16, num_tokens=16, seconds=0.05)  # a decode step
    profiler.observe("mask_kvpage", num_items=8, num_tokens=8, seconds=9.0)  # neither: ignored
    profile = profiler.profile()
    assert profile.copies_overlap and not CostProfiler(copies_overlap=False).profile().copies_overlap
    # the step is the running mean 0.9 * 64 ms + 0.1 * 50 ms; the budget is the pages copied in one step
    assert (profile.recompute_a_s, profile.recompute_b_s, profile.swap_s_per_page, profile.swap_budget_pages) == (
        0.0, pytest.approx(1e-3), pytest.approx(5e-4), 125)
