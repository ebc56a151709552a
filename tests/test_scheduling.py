"""The batch scheduler: batch formation, conflict rules, dispatch policies and counters.

Pure bookkeeping, so every test feeds the clock by hand: no sleeps, no wall clock.
"""

from __future__ import annotations

import itertools

import msgpack
import pytest

from oven.control.scheduling.batcher import Batch, BatchScheduler
from oven.control.scheduling.commands import Command
from oven.control.scheduling.footprint import Embed, HostSlot, KvSlots, TokenSlot, forward_kv_footprint
from oven.control.scheduling.policy import AdaptivePolicy, DispatchPolicy, EagerPolicy, KPolicy, TPolicy
from oven.control.scheduling.policy import NAMES
from oven.proto import inference as p

BIG = 10_000


class Harness:
    """A scheduler plus a command factory; ``add`` submits and returns the command."""

    def __init__(self) -> None:
        self.scheduler = BatchScheduler()
        self._ids = itertools.count(1)

    def queue(self, priority: int = 0, instance_id: int = 1) -> int:
        return self.scheduler.create_queue(instance_id, priority)

    def add(self, queue_id: int, call_type: str = "forward", at: float = 0.0, tokens: int = 1,
            reads=(), writes=(), kv_context=None) -> Command:
        command = Command(command_id=next(self._ids), queue_id=queue_id, call_type=call_type, item=None,
                          enqueued_at=at, num_tokens=tokens, reads=frozenset(reads), writes=frozenset(writes),
                          kv_context=kv_context)
        self.scheduler.submit(command)
        return command

    def batch(self, now: float = 100.0, max_items: int = BIG, max_tokens: int = BIG) -> Batch | None:
        return self.scheduler.form_batch(now, max_items, max_tokens)


def ids(batch: Batch) -> list[int]:
    return [c.command_id for c in batch.commands]


@pytest.fixture
def h() -> Harness:
    return Harness()


# -- choice of call type ------------------------------------------------------


def test_call_type_of_the_oldest_head_wins(h):
    q1, q2 = h.queue(), h.queue()
    h.add(q1, "next_dist", at=2.0)
    fwd = h.add(q2, "forward", at=1.0)
    batch = h.batch()
    assert batch.call_type == "forward" and ids(batch) == [fwd.command_id]
    assert h.batch().call_type == "next_dist"
    assert h.batch() is None


def test_age_tie_goes_to_higher_priority_then_lower_queue_id(h):
    low, high = h.queue(priority=0), h.queue(priority=5)
    h.add(low, "next_dist", at=1.0)
    h.add(high, "forward", at=1.0)
    assert h.batch().call_type == "forward"

    a, b = h.queue(), h.queue()
    h.add(b, "embed_text", at=3.0)
    h.add(a, "copy_kvpage", at=3.0)
    assert h.batch().call_type == "next_dist"  # still the oldest
    assert h.batch().call_type == "copy_kvpage"  # queue a has the lower id


def test_only_queue_heads_decide_the_type(h):
    """An old command behind a head of another type waits for its head."""
    q1, q2 = h.queue(), h.queue()
    h.add(q1, "embed_text", at=5.0)
    h.add(q2, "forward", at=6.0)
    h.add(q2, "next_dist", at=6.0)
    assert h.batch().call_type == "embed_text"


# -- horizontal and vertical formation ---------------------------------------


def test_horizontal_batch_takes_heads_of_every_queue_by_priority_then_age(h):
    q1, q2, q3, q4 = h.queue(priority=0), h.queue(priority=1), h.queue(priority=0), h.queue()
    c1 = h.add(q1, at=1.0)
    c2 = h.add(q2, at=3.0)
    c3 = h.add(q3, at=2.0)
    h.add(q4, "next_dist", at=0.5)
    assert h.batch().call_type == "next_dist"
    batch = h.batch()
    assert batch.call_type == "forward"
    assert ids(batch) == [c2.command_id, c1.command_id, c3.command_id]
    assert h.scheduler.num_pending == 0


def test_vertical_batch_takes_consecutive_commands_of_the_same_type(h):
    q = h.queue()
    f1, f2 = h.add(q, at=1.0), h.add(q, at=2.0)
    nd = h.add(q, "next_dist", at=3.0)
    f3 = h.add(q, at=4.0)
    assert ids(h.batch()) == [f1.command_id, f2.command_id]
    assert ids(h.batch()) == [nd.command_id]
    assert ids(h.batch()) == [f3.command_id]


def test_each_queue_keeps_fifo_order_in_a_mixed_batch(h):
    qa, qb = h.queue(priority=0), h.queue(priority=1)
    a = [h.add(qa, at=t) for t in (1.0, 2.0, 3.0)]
    b = [h.add(qb, at=t) for t in (1.5, 2.5)]
    batch = h.batch()
    # Queue b has the higher priority so it comes first; within a queue, submission order.
    assert ids(batch) == [c.command_id for c in b + a]


def test_batch_builds_its_proto_request(h):
    q = h.queue()
    items = [p.NextDistItem(embed_id=3), p.NextDistItem(embed_id=4, top_k=2)]
    for i, item in enumerate(items):
        h.scheduler.submit(Command(command_id=i, queue_id=q, call_type="next_dist", item=item, enqueued_at=0.0))
    batch = h.batch()
    assert batch.items == items
    assert batch.to_request() == p.NextDistRequest(items)
    assert batch.formed_at == 100.0


def test_a_batch_goes_out_as_the_request_its_call_type_tags():
    h = Harness()
    q = h.queue()
    for call_type in sorted(p.CALL_TYPES):
        h.add(q, call_type, at=1.0)
        request = h.batch().to_request()
        assert msgpack.unpackb(p.CODEC.encode(request))[1] == call_type


# -- conflicts ----------------------------------------------------------------


def run_of(*commands: tuple[str, set, set]) -> list[int]:
    """Submit (call_type, reads, writes) to a fresh scheduler's one queue; the ids of the first batch."""
    h = Harness()
    q = h.queue()
    for call_type, reads, writes in commands:
        h.add(q, call_type, reads=reads, writes=writes)
    return ids(h.batch())


def test_reading_what_an_earlier_command_writes_conflicts(h):
    assert len(run_of(("copy_kvpage", {KvSlots(1, 0, 4)}, {KvSlots(5, 0, 4)}),
                      ("copy_kvpage", {KvSlots(5, 2, 3)}, {KvSlots(6, 0, 1)}))) == 1


def test_writing_what_an_earlier_command_writes_conflicts(h):
    assert len(run_of(("offload", {KvSlots.page(1)}, {HostSlot(3)}),
                      ("offload", {KvSlots.page(2)}, {HostSlot(3)}))) == 1


def test_writing_what_an_earlier_non_forward_reads_is_fine(h):
    """Non-forward batches gather inputs before scattering outputs (or run in order)."""
    assert len(run_of(("copy_kvpage", {KvSlots(5, 0, 4)}, {KvSlots(6, 0, 4)}),
                      ("copy_kvpage", {KvSlots(1, 0, 4)}, {KvSlots(5, 0, 4)}))) == 2


def test_disjoint_footprints_batch(h):
    assert len(run_of(("mask_kvpage", set(), {KvSlots.page(1)}),
                      ("mask_kvpage", set(), {KvSlots.page(2)}),
                      ("mask_kvpage", set(), {KvSlots(3, 0, 8)}))) == 3


def test_whole_page_overlaps_any_slot_range_of_it(h):
    assert len(run_of(("restore", {HostSlot(1)}, {KvSlots.page(4)}),
                      ("copy_kvpage", {KvSlots(4, 15, 16)}, {KvSlots(9, 0, 1)}))) == 1
    assert len(run_of(("copy_kvpage", {KvSlots(8, 0, 1)}, {KvSlots(4, 0, 2)}),
                      ("copy_kvpage", {KvSlots(8, 0, 1)}, {KvSlots(4, 2, 4)}))) == 2


def test_conflict_is_checked_against_every_command_taken_from_the_queue(h):
    first = ("embed_text", set(), {Embed(1)})
    second = ("embed_text", set(), {Embed(2)})
    third = ("embed_text", set(), {Embed(1)})
    assert len(run_of(first, second, third)) == 2


def test_a_conflict_ends_the_run_even_if_later_commands_would_fit(h):
    q = h.queue()
    a = h.add(q, "embed_text", writes={Embed(1)})
    h.add(q, "embed_text", writes={Embed(1)})
    h.add(q, "embed_text", writes={Embed(9)})
    assert ids(h.batch()) == [a.command_id]
    assert h.scheduler.num_pending == 2


def test_conflicts_are_only_checked_within_a_queue(h):
    """Queues are independent by contract: the runtime must not give two inferlets one writable page."""
    q1, q2 = h.queue(), h.queue()
    h.add(q1, "mask_kvpage", writes={KvSlots.page(1)})
    h.add(q2, "mask_kvpage", writes={KvSlots.page(1)})
    assert len(h.batch().commands) == 2


def test_forward_may_read_kv_an_earlier_forward_of_the_batch_writes(h):
    """A 37-token prompt split into three chunks over pages [11, 3, 7] is one batch (K/V written before attention)."""
    q = h.queue()
    chunks = [(10, [11], 10), (13, [11, 3], 7), (14, [11, 3, 7], 5)]  # (num_inputs, pages, last_page_len)
    for num_inputs, pages, last in chunks:
        reads, writes = forward_kv_footprint(pages, last, num_inputs, page_size=16)
        h.add(q, "forward_text", tokens=num_inputs, reads=reads, writes=writes)
    batch = h.batch()
    assert len(batch.commands) == 3 and batch.num_tokens == 37
    # The same footprints under a call type without that guarantee would split.
    footprints = [forward_kv_footprint(pages, last, n, page_size=16) for n, pages, last in chunks]
    assert len(run_of(*(("copy_kvpage", reads, writes) for reads, writes in footprints))) == 1


def test_a_forward_names_its_context_and_batches_as_if_it_named_its_slots(h):
    """kv_context is the footprint forward_kv_footprint gives, computed only when a run is considered."""
    q = h.queue()
    chunks = [(10, [11], 10), (13, [11, 3], 7), (14, [11, 3, 7], 5)]  # as above: one batch
    for num_inputs, pages, last in chunks:
        h.add(q, "forward_text", tokens=num_inputs, kv_context=(pages, last, num_inputs, 16))
    assert len(h.batch().commands) == 3
    # Two decode steps that write the same slot (a context forwarded twice) still split.
    h.add(q, "forward_text", kv_context=([11, 3], 7, 1, 16))
    h.add(q, "forward_text", kv_context=([11, 3], 7, 1, 16))
    assert len(h.batch().commands) == 1
    command = Command(command_id=1, queue_id=q, call_type="forward", item=None, enqueued_at=0.0,
                      reads=frozenset({Embed(4)}), writes=frozenset({Embed(5)}), kv_context=([11, 3], 7, 1, 16))
    reads, writes = command.footprint()
    assert reads == {Embed(4), KvSlots(11, 0, 16), KvSlots(3, 0, 7)}
    assert writes == {Embed(5), KvSlots(3, 6, 7)}
    malformed = Command(command_id=2, queue_id=q, call_type="forward", item=None, enqueued_at=0.0,
                        kv_context=([], 7, 1, 16))
    assert malformed.footprint() == (frozenset(), frozenset())  # the inference layer reports the error


def test_forwards_writing_the_same_slot_conflict(h):
    assert len(run_of(("forward", {KvSlots(1, 0, 5)}, {KvSlots(1, 4, 5)}),
                      ("forward", {KvSlots(1, 0, 5)}, {KvSlots(1, 4, 5)}))) == 1


def test_forward_writing_kv_an_earlier_forward_reads_conflicts(h):
    """The earlier forward would attend to the later one's values."""
    assert len(run_of(("forward_text", {KvSlots(1, 0, 10)}, {KvSlots(1, 9, 10)}),
                      ("forward_text", {KvSlots(1, 0, 4)}, {KvSlots(1, 3, 4)}))) == 1


def test_forward_reading_an_embed_an_earlier_forward_writes_conflicts(h):
    """Input embeds are gathered before any output embed is stored."""
    assert len(run_of(("forward", {Embed(1), KvSlots(1, 0, 1)}, {Embed(2), KvSlots(1, 0, 1)}),
                      ("forward", {Embed(2), KvSlots(2, 0, 1)}, {Embed(3), KvSlots(2, 0, 1)}))) == 1


def test_forward_writing_an_embed_an_earlier_forward_reads_is_fine(h):
    assert len(run_of(("forward", {Embed(1), KvSlots(1, 0, 1)}, {Embed(2), KvSlots(1, 0, 1)}),
                      ("forward", {Embed(5), KvSlots(2, 0, 1)}, {Embed(1), KvSlots(2, 0, 1)}))) == 2


# -- limits -------------------------------------------------------------------


def test_truncation_at_max_items_keeps_priority_order(h):
    queues = [h.queue(priority=pr) for pr in (0, 3, 1, 2)]
    commands = [h.add(q, at=1.0 + i) for i, q in enumerate(queues)]
    batch = h.batch(max_items=3)
    # The anchor (oldest, priority 0) always goes; the two highest priorities fill the rest.
    assert ids(batch) == [commands[1].command_id, commands[3].command_id, commands[0].command_id]
    assert ids(h.batch()) == [commands[2].command_id]


def test_max_items_bounds_vertical_runs(h):
    q = h.queue()
    for t in range(5):
        h.add(q, at=float(t))
    assert [len(h.batch(max_items=2).commands) for _ in range(3)] == [2, 2, 1]


def test_max_tokens_first_fit_over_heads(h):
    q1, q2, q3 = h.queue(), h.queue(), h.queue()
    a = h.add(q1, at=1.0, tokens=4)
    h.add(q2, at=2.0, tokens=10)
    c = h.add(q3, at=3.0, tokens=2)
    batch = h.batch(max_tokens=8)
    assert ids(batch) == [a.command_id, c.command_id] and batch.num_tokens == 6


def test_max_tokens_ends_a_vertical_run_without_splitting(h):
    q = h.queue()
    a, b = h.add(q, tokens=3), h.add(q, tokens=3)
    h.add(q, tokens=3)
    h.add(q, tokens=1)  # would fit, but may not overtake its predecessor
    assert ids(h.batch(max_tokens=7)) == [a.command_id, b.command_id]


def test_heads_get_budget_before_vertical_runs(h):
    q1, q2 = h.queue(), h.queue()
    a1, a2 = h.add(q1, at=1.0), h.add(q1, at=1.0)
    h.add(q1, at=1.0)
    b1 = h.add(q2, at=2.0)
    assert ids(h.batch(max_items=3)) == [a1.command_id, a2.command_id, b1.command_id]


def test_oversize_oldest_command_is_dispatched_alone(h):
    q1, q2 = h.queue(), h.queue()
    big = h.add(q1, at=1.0, tokens=100)
    h.add(q1, at=1.0, tokens=1)
    h.add(q2, at=2.0, tokens=1)
    assert ids(h.batch(max_tokens=16)) == [big.command_id]
    assert len(h.batch(max_tokens=16).commands) == 2


def test_oversize_command_that_is_not_the_oldest_waits_its_turn(h):
    q1, q2 = h.queue(), h.queue()
    small = h.add(q1, at=1.0, tokens=1)
    big = h.add(q2, at=2.0, tokens=100)
    assert ids(h.batch(max_tokens=16)) == [small.command_id]
    assert ids(h.batch(max_tokens=16)) == [big.command_id]


def test_bad_limits_raise(h):
    with pytest.raises(ValueError, match="max_items and max_tokens must be at least 1, got 0, 10000"):
        h.batch(max_items=0)
    with pytest.raises(ValueError, match="max_items and max_tokens must be at least 1, got 10000, 0"):
        h.batch(max_tokens=0)


# -- priorities, queues, bookkeeping -----------------------------------------


def test_set_priority_reorders_the_next_batch(h):
    q1, q2 = h.queue(), h.queue()
    a, b = h.add(q1, at=1.0), h.add(q2, at=2.0)
    h.scheduler.set_priority(q2, 9)
    assert ids(h.batch()) == [b.command_id, a.command_id]


def test_remove_queue_returns_its_commands_in_fifo_order(h):
    q1, q2 = h.queue(), h.queue()
    mine = [h.add(q1, at=t) for t in (1.0, 2.0, 3.0)]
    other = h.add(q2, at=4.0)
    assert h.scheduler.remove_queue(q1) == mine
    assert h.scheduler.num_pending == 1 and h.scheduler.oldest_enqueued_at == 4.0
    assert ids(h.batch()) == [other.command_id]
    with pytest.raises(KeyError, match=f"^{q1}$"):
        h.add(q1)
    with pytest.raises(KeyError, match=f"^{q1}$"):
        h.scheduler.remove_queue(q1)


def test_remove_instance_drops_all_its_queues(h):
    q1, q2, q3 = h.queue(instance_id=7), h.queue(instance_id=8), h.queue(instance_id=7)
    a, b, c = h.add(q1), h.add(q2), h.add(q3)
    assert h.scheduler.remove_instance(7) == [a, c]
    assert h.scheduler.num_pending == 1 and ids(h.batch()) == [b.command_id]
    assert h.scheduler.remove_instance(7) == []


def test_pending_count_and_oldest(h):
    assert h.scheduler.num_pending == 0 and h.scheduler.oldest_enqueued_at is None
    assert h.batch() is None
    q1, q2 = h.queue(), h.queue()
    h.add(q1, "next_dist", at=5.0)
    h.add(q2, at=3.0)
    h.add(q2, at=4.0)
    assert h.scheduler.num_pending == 3 and h.scheduler.oldest_enqueued_at == 3.0
    h.batch()
    assert h.scheduler.num_pending == 1 and h.scheduler.oldest_enqueued_at == 5.0


def test_submit_rejects_time_travel_and_bad_commands(h):
    q = h.queue()
    h.add(q, at=2.0)
    with pytest.raises(ValueError, match="command 2 was enqueued before the queue's last command"):
        h.add(q, at=1.0)
    with pytest.raises(ValueError, match=r"unknown call type 'sample' \(expected one of \['copy_kvpage', 'embed_text', "):
        Command(command_id=1, queue_id=q, call_type="sample", item=None, enqueued_at=0.0)
    with pytest.raises(ValueError, match="num_tokens must be at least 1, got 0"):
        Command(command_id=1, queue_id=q, call_type="forward", item=None, enqueued_at=0.0, num_tokens=0)


def test_forward_kv_footprint_names_exact_slot_ranges():
    reads, writes = forward_kv_footprint([3, 4], kv_last_page_len=5, num_inputs=10, page_size=16)
    assert reads == {KvSlots(3, 0, 16), KvSlots(4, 0, 5)}
    assert writes == {KvSlots(3, 11, 16), KvSlots(4, 0, 5)}
    reads, writes = forward_kv_footprint([3, 4, 6], kv_last_page_len=16, num_inputs=1, page_size=16)
    assert writes == {KvSlots(6, 15, 16)} and len(reads) == 3
    bad_context = r"a context needs at least one page and 1 <= kv_last_page_len <= page_size"
    for pages, last, num_inputs, error in (([], 1, 1, bad_context), ([1], 0, 1, bad_context),
                                           ([1], 17, 1, bad_context),
                                           ([1], 4, 5, "5 inputs do not fit a context of 4 tokens"),
                                           ([1], 4, 0, "0 inputs do not fit a context of 4 tokens")):
        with pytest.raises(ValueError, match=error):
            forward_kv_footprint(pages, last, num_inputs, page_size=16)
    with pytest.raises(ValueError, match=r"empty or negative slot range \[4, 4\) of page 1"):
        KvSlots(1, 4, 4)


# -- stats --------------------------------------------------------------------


def test_stats_count_horizontal_and_vertical_batches(h):
    q1, q2 = h.queue(), h.queue()
    h.add(q1, at=1.0)
    h.batch(now=2.0)  # single command: neither
    h.add(q1, at=3.0)
    h.add(q2, at=3.0)
    h.batch(now=4.0)  # horizontal
    h.add(q1, at=5.0)
    h.add(q1, at=5.0)
    h.batch(now=6.0)  # vertical
    h.add(q1, at=7.0)
    h.add(q1, at=7.0)
    h.add(q2, at=7.0)
    h.batch(now=7.5)  # both
    stats = h.scheduler.stats()
    assert (stats.num_batches, stats.num_commands) == (4, 8)
    assert (stats.num_horizontal_batches, stats.num_vertical_batches) == (2, 2)
    assert stats.batch_size_histogram == ((1, 1), (2, 2), (3, 1))
    assert stats.mean_batch_size == 2.0
    assert stats.total_wait_s == pytest.approx(1.0 + 2 * 1.0 + 2 * 1.0 + 3 * 0.5)
    assert stats.mean_wait_s == pytest.approx(6.5 / 8)


def test_stats_start_empty(h):
    stats = h.scheduler.stats()
    assert stats.num_batches == 0 and stats.mean_batch_size == 0.0 and stats.mean_wait_s == 0.0


# -- policies -----------------------------------------------------------------


def ask(policy: DispatchPolicy, now: float, num_pending: int, oldest: float | None,
        idle: bool = False, in_flight: int = 1, to_run: int = 0) -> bool:
    return policy.should_dispatch(now, num_pending, oldest, idle, in_flight, to_run)


def test_named_constructors_and_names():
    assert DispatchPolicy.eager() == EagerPolicy() == DispatchPolicy.named("eager", k=8)
    assert DispatchPolicy.k(8) == KPolicy(8, 0.05) == DispatchPolicy.named("k", k=8)
    assert DispatchPolicy.t(0.005) == TPolicy(0.005) == DispatchPolicy.named("t", t_s=0.005)
    assert DispatchPolicy.adaptive() == AdaptivePolicy() == DispatchPolicy.named("adaptive")
    assert [str(DispatchPolicy.named(name, k=8, t_s=0.005)) for name in NAMES] == ["adaptive", "eager", "k=8", "t=0.005"]
    with pytest.raises(ValueError, match=r"unknown dispatch policy 'lazy' \(expected one of adaptive, eager, k, t\)"):
        DispatchPolicy.named("lazy")
    with pytest.raises(ValueError, match="k must be at least 1, got 0"):
        DispatchPolicy.named("k", k=0)
    with pytest.raises(ValueError, match="seconds must be non-negative, got -1"):
        DispatchPolicy.named("t", t_s=-1.0)
    with pytest.raises(ValueError, match="max_wait_s must be positive, got 0.0"):
        DispatchPolicy.k(4, max_wait_s=0.0)


def test_no_policy_dispatches_nothing():
    for policy in (DispatchPolicy.eager(), DispatchPolicy.k(1), DispatchPolicy.t(0.0), DispatchPolicy.adaptive()):
        assert not ask(policy, 10.0, 0, None, idle=True, in_flight=0)


def test_eager_dispatches_anything_pending_even_while_busy():
    policy = DispatchPolicy.eager()
    assert ask(policy, 1.0, 1, 1.0, idle=False, in_flight=3)
    assert policy.next_wakeup(1.0, 1.0) is None


def test_k_waits_for_k_commands_or_for_max_wait():
    policy = DispatchPolicy.k(4, max_wait_s=0.05)
    assert not ask(policy, 1.00, 3, 1.0, idle=True, in_flight=0)
    assert ask(policy, 1.00, 4, 1.0)
    assert not ask(policy, 1.04, 3, 1.0)
    assert ask(policy, 1.05, 3, 1.0)  # the oldest has waited max_wait_s: no starvation
    assert policy.next_wakeup(1.00, 1.0) == pytest.approx(1.05)
    assert policy.next_wakeup(1.00, None) is None
    # Waking at next_wakeup always finds the policy ready, whatever the float rounding.
    for oldest in (0.1, 0.7, 1234.567):
        assert ask(policy, policy.next_wakeup(oldest, oldest), 1, oldest)


def test_t_waits_for_the_oldest_to_age():
    policy = DispatchPolicy.t(0.01)
    assert not ask(policy, 2.005, 100, 2.0, idle=True, in_flight=0)
    assert ask(policy, 2.01, 1, 2.0)
    assert policy.next_wakeup(2.005, 2.0) == pytest.approx(2.01)
    assert policy.next_wakeup(2.005, None) is None
    for oldest in (0.1, 0.7, 1234.567):
        assert ask(policy, policy.next_wakeup(oldest, oldest), 1, oldest)
    assert ask(DispatchPolicy.t(0.0), 2.0, 1, 2.0)


def test_adaptive_dispatches_only_when_inference_is_idle():
    policy = DispatchPolicy.adaptive()
    assert ask(policy, 1.0, 1, 1.0, idle=True, in_flight=0)
    assert not ask(policy, 1.0, 50, 0.0, idle=False, in_flight=1)
    assert not ask(policy, 1.0, 50, 0.0, idle=True, in_flight=1)  # a notice that overtook our request
    assert not ask(policy, 1.0, 50, 0.0, idle=False, in_flight=0)
    assert policy.next_wakeup(1.0, 0.0) is None


def test_adaptive_waits_for_the_instances_still_to_run_in_the_pass():
    """A reply wakes a round of instances together: their steps go out as one batch, not as the first one's."""
    policy = DispatchPolicy.adaptive()
    assert not ask(policy, 1.0, 1, 1.0, idle=True, in_flight=0, to_run=15)
    assert ask(policy, 1.0, 16, 1.0, idle=True, in_flight=0, to_run=0)
    for other in (DispatchPolicy.eager(), DispatchPolicy.k(1), DispatchPolicy.t(0.0)):  # theirs is their own rule
        assert ask(other, 1.0, 1, 1.0, idle=True, in_flight=0, to_run=15)


def test_adaptive_sends_a_step_fed_by_a_token_future_behind_the_batch_in_flight(h):
    """A decode step whose input token the batch in flight draws goes out at once (one batch ahead, no
    more), and never in the same batch as the step that draws its token."""
    policy, q = DispatchPolicy.adaptive(), h.queue()

    def ready(in_flight: int, to_run: int = 0) -> bool:
        return policy.should_dispatch(1.0, h.scheduler.num_pending, h.scheduler.oldest_enqueued_at, in_flight == 0,
                                      in_flight, to_run, h.scheduler.num_pending_chained)

    kv = ([3], 5, 1, 16)
    h.add(q, "forward_text", writes=[TokenSlot(0)], kv_context=kv)
    h.add(q, "forward_text", reads=[TokenSlot(0)], writes=[TokenSlot(1)], kv_context=([3], 6, 1, 16))
    assert h.scheduler.num_pending_chained == 1
    assert ready(in_flight=0)
    assert len(h.batch().commands) == 1  # the reader waits for a batch of its own
    assert ready(in_flight=1) and not ready(in_flight=1, to_run=3) and not ready(in_flight=2)
    assert len(h.batch().commands) == 1 and h.scheduler.num_pending_chained == 0
    h.add(q, "forward_text", kv_context=kv)  # a step of today's kind still waits for the device
    assert not ready(in_flight=1)
    assert h.scheduler.remove_queue(q) and h.scheduler.num_pending_chained == 0


def test_a_step_fed_by_another_queues_token_waits_for_the_step_that_samples_it(h):
    """A fork's step fed by its parent's token future never goes out before, or with, the step that
    samples that token, whatever the queues' order."""
    parent, fork = h.queue(), h.queue(priority=5)
    first = h.add(parent, "copy_kvpage", at=0.0)
    sampling = h.add(parent, "forward_text", at=1.0, writes=[TokenSlot(4)])
    reader = h.add(fork, "forward_text", at=2.0, reads=[TokenSlot(4)])
    other = h.add(fork, "forward_text", at=3.0)
    assert ids(h.batch()) == [first.command_id]
    assert ids(h.batch()) == [sampling.command_id]  # the reader's queue comes first by priority: held
    assert ids(h.batch()) == [reader.command_id, other.command_id]


def test_adaptive_grows_batches_while_the_device_is_busy(h):
    """Four decode loops; the device takes 1 s a batch. Steps that arrive while it runs go out together."""
    policy, queues = DispatchPolicy.adaptive(), [h.queue() for _ in range(4)]

    def ready(now: float, idle: bool, in_flight: int) -> bool:
        return policy.should_dispatch(now, h.scheduler.num_pending, h.scheduler.oldest_enqueued_at, idle, in_flight)

    h.add(queues[0], at=0.0)
    assert ready(0.0, idle=True, in_flight=0)
    assert len(h.batch(now=0.0).commands) == 1  # no waiting for company while idle
    for i in (1, 2, 3):
        h.add(queues[i], at=0.1 * i)
        assert not ready(0.1 * i, idle=False, in_flight=1)
    h.add(queues[0], at=1.0)  # the first batch finished and its loop submitted its next step
    assert ready(1.0, idle=True, in_flight=0)
    batch = h.batch(now=1.0)
    assert [c.queue_id for c in batch.commands] == [queues[1], queues[2], queues[3], queues[0]]
