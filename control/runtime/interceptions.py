"""Intercepted instances as the control loop sees them, and the interception policy's choices carried out.

An instance is *intercepted* while it waits on I/O only (a client message, an
HTTP response, a timer): the loop knows that without being told. How long the
interception lasts comes from the instance's pause hint (``runtime.pause-hint``)
or, without one, from how long its earlier interceptions lasted (a default
before the first). Each iteration the policy (scheduling/interception.py)
chooses per intercepted instance; here the choices become tier moves:

* swap-out: its exclusive device pages go to the host tier (InferCept's swap),
  while the pool is under pressure (LOW_WATER);
* swap-in: its pages come back ahead of the expected return, when the pool has
  room and nobody waits for memory (a return that finds no room is answered by
  the exhaustion policy when the instance is due to run);
* discard: the device pages of its *recomputable* handles (the inferlet said it
  can rewrite them, ``kvpages.set-recomputable``; the SDKs' contexts do) that it
  alone holds and no forward wrote embeds into are freed at once (TierMoves.discard).
  The handles stay valid; when the instance is due to run they get fresh masked
  pages through the same path as a swap-in (admission and exhaustion included),
  and its first forward over one fails with ``kv discarded: ...`` until the
  inferlet declares it rewrites them (``kvpages.restore-discarded``): the SDKs
  then recompute their tokens in chunks and retry. Its other pages (shared,
  holding embeds, or from an inferlet that cannot recompute) are preserved;
* preserve: nothing moves.

Pages of an instance with calls queued or in flight never move.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from oven.control.resources.pool import PhysicalPool, PoolExhausted
from oven.control.resources.slab import ResourceError
from oven.control.scheduling.interception import Action, InterceptedContext, InterceptionPolicy, Location, decide
from oven.control.scheduling.profiler import COPY_CALL_TYPES, CostProfiler

from .allocator import Allocator
from .instance import Instance

DEFAULT_EXPECTED_S = 1.0  # an instance's first interception, with no hint: expected to last this long
# Idle pages waste memory only when someone could use it: pages move out only while instances wait
# for memory or fewer than this share of the pool is free (a copy into a pool that has room buys nothing).
LOW_WATER = 0.1
# How often the memory intercepted instances keep on the device is sampled (``intercepted_page_s``).
WASTE_SAMPLE_S = 0.05


def expected_return_at(inst: Instance, now: float) -> float:
    """When ``inst``'s current interception should end. One that has lasted past its expected end is
    expected to last as long again as it has: an inferlet that understates its pause is swapped out
    in the end, so it pays for the misstatement, not the instances that need the memory."""
    start = inst.io_wait_since if inst.io_wait_since is not None else now
    if inst.pause_until is not None:
        end = inst.pause_until
    else:
        end = start + (DEFAULT_EXPECTED_S if inst.mean_interception_s is None else inst.mean_interception_s)
    return end if end > now else now + (now - start)


class Interceptions:
    """``has_calls(inst)``: whether calls of ``inst`` are queued or in flight (its pages cannot move)."""

    def __init__(self, policy: InterceptionPolicy, profiler: CostProfiler, *, allocator: Allocator,
                 kv_pool: PhysicalPool, host_pool: PhysicalPool, page_size: int,
                 has_calls: Callable[[Instance], bool]):
        self.policy, self.profiler = policy, profiler
        self._allocator, self._kv_pool, self._host_pool = allocator, kv_pool, host_pool
        self._page_size, self._has_calls = page_size, has_calls
        self.num_swapped_out = self.num_swapped_in = self.num_discarded = 0
        # InferCept's preserve waste as it happened: device pages of intercepted instances x seconds, in
        # all and while memory was short (instances waited for pages, or the pool was under LOW_WATER).
        self.intercepted_page_s = self.contended_page_s = 0.0
        # Copies' memory waste: the inference process runs a copy batch between two steps (on a CPU the
        # copy itself; on CUDA its launch, the copy hides on a side stream), so the running contexts'
        # pages wait for its seconds. copy_page_s sums those seconds x the pages not intercepted.
        self.copy_s = self.copy_page_s = 0.0
        self._sampled_at: float | None = None
        self._num_intercepted_pages = 0  # at the last sample

    def step(self, instances: Iterable[Instance], now: float) -> None:
        """One iteration: decide for every intercepted instance whose pages can move, and move them."""
        pressure = self._allocator.num_waiting > 0 or self._kv_pool.num_free < LOW_WATER * self._kv_pool.size
        self._sample_waste(instances, now, pressure)
        if not pressure and not self._host_pool.num_used:
            return  # every loop turn: nothing to swap out, and nothing swapped out to bring back
        by_id, contexts, num_intercepted_pages = {}, [], 0
        for inst in instances:
            if not inst.io_idle or inst.swapping or self._allocator.is_waiting(inst) or self._has_calls(inst):
                continue
            recomputable = True
            if inst.swapped_out:
                if not inst.resources.num_offloaded:
                    continue  # discarded: nothing to bring back ahead, its pages are recomputed when it runs
                location, num_pages = Location.HOST, len(inst.swapped_out)
            elif not pressure:
                continue
            else:
                location, num_pages = Location.DEVICE, len(inst.resources.exclusive_device_handles())
                num_intercepted_pages += num_pages
                # Pages it cannot recompute (embeds written, or an inferlet that never said it can) are
                # preserved even when discard is chosen; with none recomputable, discard is not an option.
                recomputable = bool(inst.resources.discardable_handles())
            if num_pages:
                by_id[inst.instance_id] = inst
                # The control layer does not see token counts: its pages' capacity bounds them.
                contexts.append(InterceptedContext(inst.instance_id, inst.started_at, num_pages,
                                                   num_pages * self._page_size, expected_return_at(inst, now),
                                                   location, recomputable))
        if not contexts:
            return
        running_pages = self._kv_pool.num_used - num_intercepted_pages
        num_discarded = self.num_discarded
        for choice in decide(self.policy, contexts, self.profiler.profile(), now, running_pages):
            inst = by_id[choice.context_id]
            if choice.action is Action.SWAP_OUT:
                # With the host tier full, the next best of the policy's options: discard or preserve.
                if not self._swap_out(inst) and choice.waste_discard < choice.waste_preserve:
                    self._discard(inst)
            elif choice.action is Action.DISCARD:
                self._discard(inst)
            elif choice.action is Action.SWAP_IN and self._allocator.admitting and \
                    len(inst.swapped_out) <= self._kv_pool.num_free:
                self._allocator.swap_in(inst)
                self.num_swapped_in += 1
        if self.num_discarded > num_discarded:  # once every choice is carried out: a retry may move pages too
            self._allocator.retry_parked()

    def observe_batch(self, call_type: str, num_items: int, num_tokens: int, seconds: float) -> None:
        """One answered batch (InferenceCalls' ``on_batch``): the cost profiler learns from it, and a
        copy's seconds count against the pages of the contexts it kept waiting."""
        self.profiler.observe(call_type, num_items, num_tokens, seconds)
        if call_type in COPY_CALL_TYPES:
            self.copy_s += seconds
            self.copy_page_s += seconds * max(0, self._kv_pool.num_used - self._num_intercepted_pages)

    def _sample_waste(self, instances: Iterable[Instance], now: float, pressure: bool) -> None:
        """Add the device pages intercepted instances hold now x the time since the last sample (at
        most every WASTE_SAMPLE_S: counting pages walks every instance's table)."""
        if self._sampled_at is not None and now - self._sampled_at < WASTE_SAMPLE_S:
            return
        if self._sampled_at is not None:
            num_pages = sum(len(inst.resources.exclusive_device_handles()) for inst in instances if inst.io_idle)
            self._num_intercepted_pages = num_pages
            self.intercepted_page_s += num_pages * (now - self._sampled_at)
            if pressure:
                self.contended_page_s += num_pages * (now - self._sampled_at)
        self._sampled_at = now

    def _swap_out(self, inst: Instance) -> bool:
        """Whether its pages are on their way to the host tier."""
        try:
            self._allocator.tiers.swap_out(inst)
        except (PoolExhausted, ResourceError):  # the host tier is full: it stays on the device
            inst.swapping = False
            return False
        self.num_swapped_out += 1
        return True

    def _discard(self, inst: Instance) -> None:
        if self._allocator.tiers.discard(inst):
            self.num_discarded += 1
