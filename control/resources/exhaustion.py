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

  Between clients, ``preempt`` keeps :class:`FairShares`: while several clients hold or want
  pages, each may claim the pool over their number (rounded up) and keeps it (rounded down). A
  requester whose client, with what it asks for, stays within its claim may take pages of another
  client that holds more than it keeps: that client's instances, idle ones first and of any age,
  are swapped out until it is down to what it keeps, and its idle ones that the host tier has no
  room for are terminated. A client over its share takes nobody else's pages: it waits.

The runtime calls again whenever the picture changes (an instance exits or
blocks), so a parked call is re-decided rather than left to deadlock.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
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
    ``io_wait_since``: when it began waiting on I/O (a tool call, http, the user, a timer), else None.
    ``blocked_since``: when it was parked on an allocation under ``wait``, else None.
    ``client``: who launched it (see :class:`FairShares`). ``num_on_host``: host slots its offloaded
    KvPages take, given back if it ends.
    """

    instance_id: Hashable
    started_at: float
    num_reclaimable: int
    num_offloadable: int = 0
    num_arriving: int = 0
    io_wait_since: float | None = None
    blocked_since: float | None = None
    client: Hashable = None
    num_on_host: int = 0


@dataclass(frozen=True, slots=True)
class FairShares:
    """The KvPage pool split evenly between the clients whose instances hold or want pages. Each may claim
    ``share`` pages (the pool over their number, rounded up) and keeps ``floor`` (rounded down) whoever
    claims: one client's claim is met from the pages others hold beyond their floors. ``held`` is what
    each holds (:func:`held_by_client`)."""

    share: int
    floor: int
    held: Mapping[Hashable, int]

    @classmethod
    def of(cls, pool_size: int, held: Mapping[Hashable, int], wanting: Iterable[Hashable] = ()) -> FairShares:
        """Shares of a pool of ``pool_size`` between the clients that hold pages and those ``wanting`` them."""
        held = {client: n for client, n in held.items() if n > 0}
        for client in wanting:
            held.setdefault(client, 0)
        num_clients = max(1, len(held))
        return cls(-(-pool_size // num_clients), pool_size // num_clients, held)

    @property
    def contended(self) -> bool:
        """More than one client holds or wants pages (one alone is owed the whole pool)."""
        return len(self.held) > 1

    def over(self, client: Hashable, more: int = 0) -> bool:
        """Whether ``client``, given ``more`` pages, would hold more than its share of a contended pool."""
        return self.contended and self.held.get(client, 0) + more > self.share

    def above(self, client: Hashable) -> int:
        """Pages ``client`` holds beyond its floor: what others within their shares may take (0 if none)."""
        return max(0, self.held.get(client, 0) - self.floor)


def held_by_client(instances: Iterable[InstanceUsage]) -> dict[Hashable, int]:
    """KvPages each client's instances hold (or will once their restores land)."""
    held: dict[Hashable, int] = {}
    for usage in instances:
        held[usage.client] = held.get(usage.client, 0) + _num_held(usage)
    return held


@dataclass(frozen=True, slots=True)
class Decision:
    """One of: instances to terminate, instances to offload, or wait. Only ``over_share`` decisions do
    both: their victims' clients hold more than their fair share of the pool (:class:`FairShares`), and
    those terminated are idle ones that the host tier had no room for."""

    terminate: tuple[Hashable, ...] = ()
    offload: tuple[Hashable, ...] = ()
    wait: bool = False
    over_share: bool = False


def choose_victims(
    policy: ExhaustionPolicy,
    instances: Sequence[InstanceUsage],
    requester_id: Hashable,
    needed: int,
    now: float,
    num_free_host_slots: int = 0,
    shares: FairShares | None = None,
    requested: int | None = None,
) -> Decision:
    """Decide how ``requester_id`` gets ``needed`` more units than are free.

    ``instances`` lists every live instance, requester included; ties in
    ``started_at`` count a later-listed instance as newer. ``shares``: the
    clients' shares of the KvPage pool (``preempt`` keeps them), and ``requested``
    all the requester asks for (``needed`` of it is not free). Raises ValueError
    if the requester is not listed or ``needed`` < 1.
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
        return _preempt(instances, index, needed, now, num_free_host_slots, shares,
                        needed if requested is None else requested)
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
             num_free_host_slots: int, shares: FairShares | None, requested: int) -> Decision:
    requester = instances[index]
    rank = (requester.started_at, index)
    others = [u for i, u in enumerate(instances) if i != index]
    if sum(_num_held(u) for u in others) < needed:
        return Decision(terminate=(requester.instance_id,))  # it cannot fit even alone: waiting is forever
    # Whose pages the requester may take, and how many of another client's (those beyond its share).
    takeable: dict[Hashable, int] | None = None
    if shares is not None and shares.contended:
        entitled = not shares.over(requester.client, requested)
        takeable = {client: shares.above(client) for client in shares.held
                    if client != requester.client and entitled and shares.above(client)}
    fair = [i for i, u in enumerate(instances) if takeable is None or u.client == requester.client
            or u.client in takeable]
    idle = _by_idle_waste([instances[i] for i in fair if i != index and instances[i].io_wait_since is not None], now)
    # Running instances newer than the requester, and any of a client over its share, newest first.
    running = sorted((i for i in fair if instances[i].io_wait_since is None and (
        (instances[i].started_at, i) > rank or (takeable is not None and instances[i].client in takeable))),
        key=lambda i: (instances[i].started_at, i), reverse=True)
    chosen = _covering(idle + [instances[i] for i in running], needed, num_free_host_slots, takeable)
    if chosen:
        return Decision(offload=chosen)
    if takeable:
        ended = _ending_idle_over_share([u for u in idle if u.client in takeable], needed, num_free_host_slots,
                                        takeable)
        if ended is not None:
            return ended
    # Pages come back when a holder that is not itself parked runs on and frees them, or when
    # an older parked instance swaps the requester out (it gives up what it holds). One whose pages
    # are arriving from the host runs on once they land (or can be swapped out again then).
    if (any(u.blocked_since is None and _num_held(u) > 0 for u in others)
            or 0 < requester.num_offloadable <= num_free_host_slots):
        return Decision(wait=True)
    fair_instances = [instances[i] for i in fair]
    return Decision(terminate=_newest_first(fair_instances, fair.index(index), needed))


def _ending_idle_over_share(idle: list[InstanceUsage], needed: int, num_free_host_slots: int,
                            takeable: dict[Hashable, int]) -> Decision | None:
    """Free ``needed`` pages from idle instances of clients over their share (``takeable``: the pages
    each has beyond it), in order: those the host tier has room for are swapped out, the others
    terminated (what they hold on the host makes room for the next). None if they cannot cover it."""
    offload, terminate, freed, free_slots, left = [], [], 0, num_free_host_slots, dict(takeable)
    for fits_only in (True, False):  # first every swap that fits as it is, then the rest
        for usage in idle:
            if freed >= needed:
                break
            if left[usage.client] <= 0 or usage.instance_id in offload or usage.instance_id in terminate:
                continue
            if 0 < usage.num_offloadable <= free_slots:
                offload.append(usage.instance_id)
                pages, free_slots = usage.num_offloadable, free_slots - usage.num_offloadable
            elif fits_only or _num_held(usage) == 0:
                continue
            else:
                terminate.append(usage.instance_id)
                pages, free_slots = _num_held(usage), free_slots + usage.num_on_host
            freed += pages
            left[usage.client] -= pages
    if freed < needed or not terminate:
        return None
    return Decision(terminate=tuple(terminate), offload=tuple(offload), over_share=True)


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


def _covering(candidates: list[InstanceUsage], needed: int, num_free_host_slots: int,
              takeable: dict[Hashable, int] | None = None) -> tuple[Hashable, ...]:
    """The first of ``candidates``, in order, whose offloadable pages cover ``needed`` within the free
    host slots (one that does not fit is skipped), or () when they cannot. A candidate of a client in
    ``takeable`` is taken only while that client has pages beyond its share left."""
    chosen, freed, free_slots, left = [], 0, num_free_host_slots, dict(takeable or {})
    for usage in candidates:
        if usage.num_offloadable == 0 or left.get(usage.client, 1) <= 0:
            continue
        if freed >= needed:
            break
        if usage.num_offloadable <= free_slots:
            chosen.append(usage.instance_id)
            freed += usage.num_offloadable
            free_slots -= usage.num_offloadable
            if usage.client in left:
                left[usage.client] -= usage.num_offloadable
    return tuple(chosen) if freed >= needed else ()
