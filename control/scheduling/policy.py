"""When to dispatch a batch: the policies compared in Pie's Table 5.

A policy only answers *when*; :class:`~.batcher.BatchScheduler` decides *what*
goes into the batch. Policies are pure: the clock comes in as ``now`` (seconds,
any monotonic origin shared with ``enqueued_at``), so they hold no state and
are tested with hand-fed times. The runtime asks :meth:`should_dispatch` after
every submission, every finished batch and every wakeup, and sleeps until
:meth:`next_wakeup` when there is nothing else to wait for.

Deadlines are checked as ``now >= deadline`` against the very float
:meth:`next_wakeup` returns, so waking at that time always finds the policy
ready (``now - oldest >= t`` can miss by a rounding error and spin).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["NAMES", "DispatchPolicy", "EagerPolicy", "KPolicy", "TPolicy", "AdaptivePolicy"]

DEFAULT_MAX_WAIT_S = 0.05
DEFAULT_K = 32
DEFAULT_T_S = 0.005


class DispatchPolicy(ABC):
    """Decides whether the pending commands should be formed into a batch now."""

    __slots__ = ()

    @abstractmethod
    def should_dispatch(self, now: float, num_pending_commands: int, oldest_enqueued_at: float | None,
                        inference_idle: bool, num_in_flight_batches: int, instances_to_run: int = 0,
                        num_pending_chained: int = 0) -> bool:
        """True when a batch should be formed now; always False when nothing is pending.

        ``oldest_enqueued_at`` is that of the oldest pending command (None when
        none); ``inference_idle`` is the inference layer's own report that it has
        nothing queued; ``num_in_flight_batches`` counts batches sent and not yet
        answered; ``instances_to_run`` counts the ready instances the runtime has
        yet to run in its current pass (each may add commands); ``num_pending_chained`` counts the
        pending commands fed by a token future (``BatchScheduler.num_pending_chained``).
        """

    def next_wakeup(self, now: float, oldest_enqueued_at: float | None) -> float | None:
        """The time at which :meth:`should_dispatch` may turn true with no new event, or None.

        It may be at or before ``now``: re-check at once.
        """
        return None

    @staticmethod
    def eager() -> EagerPolicy:
        return EagerPolicy()

    @staticmethod
    def k(k: int = DEFAULT_K, max_wait_s: float = DEFAULT_MAX_WAIT_S) -> KPolicy:
        return KPolicy(k, max_wait_s)

    @staticmethod
    def t(seconds: float = DEFAULT_T_S) -> TPolicy:
        return TPolicy(seconds)

    @staticmethod
    def adaptive() -> AdaptivePolicy:
        return AdaptivePolicy()

    @staticmethod
    def named(name: str, *, k: int = DEFAULT_K, t_s: float = DEFAULT_T_S) -> DispatchPolicy:
        """The policy called ``name``, one of :data:`NAMES` (the config's ``dispatch_policy``); ``k``
        and ``t_s`` go to the policies of those names.

        Raises ValueError for another name or a bad ``k`` / ``t_s``.
        """
        make = _BY_NAME.get(name)
        if make is None:
            raise ValueError(f"unknown dispatch policy {name!r} (expected one of {', '.join(NAMES)})")
        return make(k, t_s)


def _nothing_pending(num_pending_commands: int, oldest_enqueued_at: float | None) -> bool:
    return num_pending_commands <= 0 or oldest_enqueued_at is None


@dataclass(frozen=True, slots=True)
class EagerPolicy(DispatchPolicy):
    """Dispatch as soon as anything is pending, even while the device is busy.

    No batching beyond what piles up between two checks: Pie's baseline "Eager".
    """

    def should_dispatch(self, now, num_pending_commands, oldest_enqueued_at, inference_idle,
                        num_in_flight_batches, instances_to_run=0, num_pending_chained=0) -> bool:
        return not _nothing_pending(num_pending_commands, oldest_enqueued_at)

    def __str__(self) -> str:
        return "eager"


@dataclass(frozen=True, slots=True)
class KPolicy(DispatchPolicy):
    """Dispatch once at least ``k`` commands are pending (Pie's "K-only").

    Pure K would hold the last few commands forever when fewer than ``k``
    remain, so the oldest command also forces a dispatch once it has waited
    ``max_wait_s``.
    """

    k: int
    max_wait_s: float = DEFAULT_MAX_WAIT_S

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"k must be at least 1, got {self.k}")
        if not self.max_wait_s > 0:
            raise ValueError(f"max_wait_s must be positive, got {self.max_wait_s}")

    def should_dispatch(self, now, num_pending_commands, oldest_enqueued_at, inference_idle,
                        num_in_flight_batches, instances_to_run=0, num_pending_chained=0) -> bool:
        if _nothing_pending(num_pending_commands, oldest_enqueued_at):
            return False
        return num_pending_commands >= self.k or now >= self.next_wakeup(now, oldest_enqueued_at)

    def next_wakeup(self, now, oldest_enqueued_at) -> float | None:
        return None if oldest_enqueued_at is None else oldest_enqueued_at + self.max_wait_s

    def __str__(self) -> str:
        return f"k={self.k}"


@dataclass(frozen=True, slots=True)
class TPolicy(DispatchPolicy):
    """Dispatch once the oldest pending command has waited ``seconds`` (Pie's "T-only")."""

    seconds: float

    def __post_init__(self) -> None:
        if not self.seconds >= 0:
            raise ValueError(f"seconds must be non-negative, got {self.seconds}")

    def should_dispatch(self, now, num_pending_commands, oldest_enqueued_at, inference_idle,
                        num_in_flight_batches, instances_to_run=0, num_pending_chained=0) -> bool:
        if _nothing_pending(num_pending_commands, oldest_enqueued_at):
            return False
        return now >= self.next_wakeup(now, oldest_enqueued_at)

    def next_wakeup(self, now, oldest_enqueued_at) -> float | None:
        return None if oldest_enqueued_at is None else oldest_enqueued_at + self.seconds

    def __str__(self) -> str:
        return f"t={self.seconds:g}"


@dataclass(frozen=True, slots=True)
class AdaptivePolicy(DispatchPolicy):
    """Work-conserving (Pie §6.1): dispatch the moment the device is idle and the
    control layer has nothing more to add.

    While a batch runs, commands pile up and become the next, larger batch; when
    load is light each command goes out alone without waiting for company. Idle
    means both views agree: the inference layer says so and the control layer
    has no batch in flight (an idle notice can overtake a request just sent).
    The ready instances of the runtime's current pass run first: the instances a
    batch's reply woke are ready together, and dispatching after the first one's
    slice split every decode round in two (a batch of one, then the rest; 6.4
    items per batch for 16 lockstep instances), each batch reading all weights.

    Steps fed by a token future are the exception (xLLM's asynchronous schedule): their inputs
    are drawn by the batch in flight, so they go out behind it at once, one batch ahead, and the
    inference process starts them the moment it finishes that batch instead of idling for the
    reply, the inferlets' slices and the next send.
    """

    def should_dispatch(self, now, num_pending_commands, oldest_enqueued_at, inference_idle,
                        num_in_flight_batches, instances_to_run=0, num_pending_chained=0) -> bool:
        if _nothing_pending(num_pending_commands, oldest_enqueued_at) or instances_to_run:
            return False
        if num_pending_chained and num_in_flight_batches == 1:
            return True
        return inference_idle and num_in_flight_batches == 0

    def __str__(self) -> str:
        return "adaptive"


# The names of the policies (the config's ``dispatch_policy``), in the order --help lists them.
_BY_NAME: dict[str, Callable[[int, float], DispatchPolicy]] = {
    "adaptive": lambda k, t_s: DispatchPolicy.adaptive(),
    "eager": lambda k, t_s: DispatchPolicy.eager(),
    "k": lambda k, t_s: DispatchPolicy.k(k),
    "t": lambda k, t_s: DispatchPolicy.t(t_s),
}
NAMES = tuple(_BY_NAME)
