"""What to do when an allocation finds its pool exhausted: a pure policy over a snapshot.

The runtime catches PoolExhausted, snapshots every instance as an
:class:`InstanceUsage`, and asks :func:`choose_victims` for a :class:`Decision`;
carrying it out (killing, offloading, parking the call) is the runtime's job.
Three policies, named as in the config:

* ``terminate-newest`` — Pie's FCFS: kill the most recently started instances
  until enough is freed, so older ones progress. If killing every instance newer
  than the requester would not be enough, the requester itself is the one to go
  (it is newer than everyone it would otherwise displace).
* ``wait`` — park the call until pages are freed; fall back to terminate-newest
  when waiting cannot succeed (nobody who could free enough is still running)
  or has lasted ``max_wait_s``.
* ``offload`` — InferCept's *swap*: move the device pages of instances that are
  waiting on I/O to the host tier, those wasting the most memory x time first;
  fall back to terminate-newest when that cannot free enough.
* ``preempt`` (the default) — vLLM's preemption, with swap as its first answer:
  swap out instances waiting on I/O, then the newest instances newer than the
  requester (their own allocations wait, FCFS by arrival); when neither covers
  the shortage, the requester waits while anyone can still free or take pages
  from it. Killing is left for a deadlock that no swap can break: every holder
  parked and the host tier too small.

The runtime calls again whenever the picture changes (an instance exits or
blocks), so a parked call is re-decided rather than left to deadlock.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

TERMINATE_NEWEST = "terminate-newest"
WAIT = "wait"
OFFLOAD = "offload"
PREEMPT = "preempt"
POLICY_NAMES = (PREEMPT, TERMINATE_NEWEST, WAIT, OFFLOAD)


@dataclass(frozen=True, slots=True)
class ExhaustionPolicy:
    name: str
    max_wait_s: float | None = None  # WAIT only: give up waiting after this long (None: never)

    def __post_init__(self):
        if self.name not in POLICY_NAMES:
            raise ValueError(f"unknown exhaustion policy {self.name!r}; expected one of {', '.join(POLICY_NAMES)}")
        if self.max_wait_s is not None and (self.name != WAIT or self.max_wait_s < 0):
            raise ValueError(f"max_wait_s must be >= 0 and applies to {WAIT!r} only")

    @classmethod
    def terminate_newest(cls) -> ExhaustionPolicy:
        return cls(TERMINATE_NEWEST)

    @classmethod
    def wait(cls, max_wait_s: float | None = None) -> ExhaustionPolicy:
        return cls(WAIT, max_wait_s)

    @classmethod
    def offload(cls) -> ExhaustionPolicy:
        return cls(OFFLOAD)

    @classmethod
    def preempt(cls) -> ExhaustionPolicy:
        return cls(PREEMPT)

    @property
    def fcfs(self) -> bool:
        """Allocations are granted in arrival order: a newer instance waits behind an older parked one,
        and new instances are not started while anyone waits (admission control)."""
        return self.name == PREEMPT


@dataclass(frozen=True, slots=True)
class InstanceUsage:
    """One instance at decision time; counts are in units of the exhausted kind.

    ``num_reclaimable``: freed if the instance exits (``ExportRegistry.num_freed_by_exit``
    for KvPages, ``num_embeds`` for Embeds). ``num_offloadable``: KvPages freed if its
    exclusive device pages move to the host tier now (0 for an Embed shortage, and 0 while
    calls that use them are queued or in flight).
    ``num_arriving``: KvPages a restore is copying its swapped-out pages into: taken from the
    pool, in no table until the copy lands, then reclaimable (or freed, if it has exited).
    ``io_wait_since``: when it began waiting on I/O (a tool call, http, the user), else None.
    ``blocked_since``: when it was parked on an allocation under ``wait``, else None.
    """

    instance_id: Hashable
    started_at: float
    num_reclaimable: int
    num_offloadable: int = 0
    num_arriving: int = 0
    io_wait_since: float | None = None
    blocked_since: float | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    """Exactly one of: instances to terminate, instances to offload, or wait."""

    terminate: tuple[Hashable, ...] = ()
    offload: tuple[Hashable, ...] = ()
    wait: bool = False


def choose_victims(
    policy: ExhaustionPolicy,
    instances: Sequence[InstanceUsage],
    requester_id: Hashable,
    needed: int,
    now: float,
    num_free_host_slots: int = 0,
) -> Decision:
    """Decide how ``requester_id`` gets ``needed`` more units than are free.

    ``instances`` lists every live instance, requester included; ties in
    ``started_at`` count a later-listed instance as newer. Raises ValueError if
    the requester is not listed or ``needed`` < 1.
    """
    if needed < 1:
        raise ValueError(f"needed must be >= 1, got {needed}")
    index = next((i for i, u in enumerate(instances) if u.instance_id == requester_id), None)
    if index is None:
        raise ValueError(f"requester {requester_id!r} is not among the instances")
    requester = instances[index]
    others = [u for i, u in enumerate(instances) if i != index]
    if policy.name == OFFLOAD:
        chosen = _offload_candidates(others, needed, now, num_free_host_slots)
        if chosen:
            return Decision(offload=chosen)
    elif policy.name == PREEMPT:
        return _preempt(instances, index, needed, now, num_free_host_slots)
    elif policy.name == WAIT and _waiting_can_succeed(policy, requester, others, needed, now):
        return Decision(wait=True)
    return Decision(terminate=_newest_first(instances, index, needed))


def _newest_first(instances: Sequence[InstanceUsage], requester_index: int, needed: int) -> tuple[Hashable, ...]:
    requester = instances[requester_index]
    rank = (requester.started_at, requester_index)
    newer_indices = [i for i, u in enumerate(instances) if (u.started_at, i) > rank]
    newer_indices.sort(key=lambda i: (instances[i].started_at, i), reverse=True)
    newer = [instances[i] for i in newer_indices]
    if sum(u.num_reclaimable for u in newer) < needed:
        return (requester.instance_id,)
    victims, freed = [], 0
    for usage in newer:
        if freed >= needed:
            break
        if usage.num_reclaimable > 0:  # killing an instance that holds nothing frees nothing
            victims.append(usage.instance_id)
            freed += usage.num_reclaimable
    return tuple(victims)


def _waiting_can_succeed(
    policy: ExhaustionPolicy, requester: InstanceUsage, others: list[InstanceUsage], needed: int, now: float
) -> bool:
    waited_s = None if requester.blocked_since is None else now - requester.blocked_since
    if policy.max_wait_s is not None and waited_s is not None and waited_s >= policy.max_wait_s:
        return False
    if sum(_num_held(u) for u in others) < needed:
        return False  # even if every other instance exited, there would not be enough
    # Someone holding memory must still be able to run and free it; if every holder is
    # itself parked on an allocation, nobody ever frees anything.
    return any(u.blocked_since is None and _num_held(u) > 0 for u in others)


def _num_held(usage: InstanceUsage) -> int:
    """Pages the instance holds or will hold once its restore lands. Pages in flight back from the
    host tier are in no table, yet they are no less taken: counting only ``num_reclaimable`` made a
    pool full of restores look empty of holders, and an instance that could wait was killed for it."""
    return usage.num_reclaimable + usage.num_arriving


def _preempt(instances: Sequence[InstanceUsage], index: int, needed: int, now: float,
             num_free_host_slots: int) -> Decision:
    requester = instances[index]
    rank = (requester.started_at, index)
    others = [u for i, u in enumerate(instances) if i != index]
    if sum(_num_held(u) for u in others) < needed:
        return Decision(terminate=(requester.instance_id,))  # it cannot fit even alone: waiting is forever
    idle = _by_idle_waste([u for u in others if u.io_wait_since is not None], now)
    newer = sorted((i for i, u in enumerate(instances) if (u.started_at, i) > rank and u.io_wait_since is None),
                   key=lambda i: (instances[i].started_at, i), reverse=True)
    chosen = _covering(idle + [instances[i] for i in newer], needed, num_free_host_slots)
    if chosen:
        return Decision(offload=chosen)
    # Pages come back when a holder that is not itself parked runs on and frees them, or when
    # an older parked instance swaps the requester out (it gives up what it holds). One whose pages
    # are arriving from the host runs on once they land (or can be swapped out again then).
    if (any(u.blocked_since is None and _num_held(u) > 0 for u in others)
            or 0 < requester.num_offloadable <= num_free_host_slots):
        return Decision(wait=True)
    return Decision(terminate=_newest_first(instances, index, needed))


def _by_idle_waste(waiting: list[InstanceUsage], now: float) -> list[InstanceUsage]:
    # InferCept ranks paused requests by the memory x time that preserving them wastes; the
    # remaining wait is unknown, so the time already waited stands in for it.
    return sorted(waiting, key=lambda u: u.num_offloadable * (now - u.io_wait_since), reverse=True)


def _offload_candidates(
    others: list[InstanceUsage], needed: int, now: float, num_free_host_slots: int
) -> tuple[Hashable, ...]:
    """Instances waiting on I/O whose pages cover ``needed`` within the free host slots, or ()."""
    return _covering(_by_idle_waste([u for u in others if u.io_wait_since is not None], now), needed,
                     num_free_host_slots)


def _covering(candidates: list[InstanceUsage], needed: int, num_free_host_slots: int) -> tuple[Hashable, ...]:
    """The first of ``candidates``, in order, whose offloadable pages cover ``needed`` within the free
    host slots (one that does not fit is skipped), or () when they cannot."""
    chosen, freed, free_slots = [], 0, num_free_host_slots
    for usage in candidates:
        if usage.num_offloadable == 0:
            continue
        if freed >= needed:
            break
        if usage.num_offloadable <= free_slots:
            chosen.append(usage.instance_id)
            freed += usage.num_offloadable
            free_slots -= usage.num_offloadable
    return tuple(chosen) if freed >= needed else ()
