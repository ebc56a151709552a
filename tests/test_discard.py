"""InferCept's discard, carried out (control/runtime/interceptions.py, tiers.py, resources/table.py) and
recomputed by the SDKs (sdk/python/inferlet/recompute.py, sdk/rust/oven/src/context/recompute.rs).

The table tests pin which pages may be discarded and what a discarded handle answers; the loop tests
pause real inferlets (tiny model) on a pool they nearly fill, so the interception policy acts on them,
and resume them.
"""

from __future__ import annotations

import time

import pytest
from harness import (
    NUM_EMBEDS,
    PROGRAM_DIR,
    Server,
    built,
    control_loop,
    messages,
    tiny_inference,
    wait_exit,
)
from oven.control.resources.exports import ExportRegistry
from oven.control.resources.pool import PhysicalPool
from oven.control.resources.slab import ResourceError
from oven.control.resources.table import BLANK, DEVICE, DISCARDED, KV_DISCARDED, ResourceTable
from oven.control.runtime.futures import Future
from oven.control.runtime.host import forward, kvpages
from oven.control.runtime.instance import State
from oven.control.runtime.interceptions import Interceptions
from oven.control.scheduling.interception import InterceptionPolicy
from oven.control.tokenizer import Tokenizer

# -- the table ----------------------------------------------------------------------------------------


def table_over(kv_pool: PhysicalPool, instance_id: str = "a") -> ResourceTable:
    return ResourceTable(instance_id, kv_pool, PhysicalPool("embed", 4), PhysicalPool("host slot", 4))


def test_only_recomputable_pages_no_one_else_holds_and_no_embed_was_written_into_may_be_discarded():
    kv_pool = PhysicalPool("kvpage", 8)
    exports, table = ExportRegistry(kv_pool), table_over(kv_pool)
    plain, exported, embedded, _undeclared = table.alloc_kvpages(4)
    assert table.discardable_handles() == []  # nothing declared recomputable: an inferlet on the raw API
    table.set_recomputable([plain, exported, embedded], True)
    exports.export_kvpages(table, "shared", [exported])
    table.note_embeds_written([embedded])
    assert table.discardable_handles() == [plain]
    table.set_recomputable([plain], False)
    assert table.discardable_handles() == []


def test_a_discarded_page_goes_back_to_the_pool_and_its_handle_refuses_forwards_until_restored():
    kv_pool = PhysicalPool("kvpage", 4)
    table = table_over(kv_pool)
    first, second = table.alloc_kvpages(2)
    table.set_recomputable([first, second], True)
    table.mark_discarded([first])
    assert (kv_pool.num_free, table.location(first), table.num_discarded) == (3, DISCARDED, 1)
    with pytest.raises(ResourceError, match=f"^{KV_DISCARDED} kvpage handle {first} lost its K/V"):
        table.physical_pages([second, first])
    (fresh,) = kv_pool.allocate(1)
    table.mark_blank([first], [fresh])  # back on the device, still refused: its slots hold nothing
    assert (table.location(first), kv_pool.num_free) == (BLANK, 2)
    with pytest.raises(ResourceError, match=f"^{KV_DISCARDED}"):
        table.physical_pages([first])
    assert table.restore_discarded([second, first]) == [first]  # only the discarded one was restored
    assert (table.location(first), table.physical_pages([first]), table.num_discarded) == (DEVICE, [fresh], 0)


def test_releasing_a_table_with_discarded_and_blank_pages_frees_every_page():
    kv_pool = PhysicalPool("kvpage", 4)
    table = table_over(kv_pool)
    handles = table.alloc_kvpages(3)
    table.set_recomputable(handles, True)
    table.mark_discarded(handles[:2])
    table.mark_blank(handles[1:2], kv_pool.allocate(1))
    table.release_all()
    assert kv_pool.num_free == 4


# -- real inferlets in the control loop -----------------------------------------------------------------

NUM_PAGES = 11  # the paused context takes 10 of them: under the pool's 10 % low water mark
PROMPT = " ".join(f"item{i}" for i in range(52))
NEW = 16
PROGRAMS = ("text-completion", "text-completion-rust")


@pytest.fixture(scope="module")
def inference():
    with tiny_inference(num_kv_pages=NUM_PAGES, num_host_pages=16) as process:
        yield process


def test_the_paused_context_fills_ten_pages_so_it_is_recomputed_in_two_chunks(inference):
    forwarded = len(Tokenizer(inference.info.tokenizer).encode(PROMPT)) + NEW // 2 - 1
    assert 9 * 16 < forwarded <= 10 * 16  # RECOMPUTE_CHUNK_PAGES is 8


def paused_run(inference, program: str, policy: str, then=None) -> tuple[str, int, str]:
    """Run ``program`` with a pause under ``policy``; (its generated ids, contexts discarded, its state
    while paused). ``then(loop, inst)``, if given, replaces resuming it."""
    with control_loop(inference, None, [program], interception_policy=policy) as loop:
        inst = loop.launch(program, [PROMPT, str(NEW), "--pause", "60000"])
        assert loop.run_until(lambda: inst.io_idle and not loop.replicas[0].calls.has_calls(inst), 60)
        for _ in range(3):  # the policy decides every turn
            loop.step(0.001)
        paused_state = inst.record().shown_state
        if paused_state == "discarded":  # every page of the paused context went back to the pool
            assert (loop.replicas[0].kv_pool.num_free, loop.snapshot().num_discarded) == (NUM_PAGES, 1)
        if then is not None:
            then(loop, inst)
            return "", loop.replicas[0].interceptions.num_discarded, paused_state
        loop.deliver(inst.instance_id, "go on")
        assert loop.run_until(lambda: not inst.alive, 60)
        assert (inst.state, inst.error) == (State.FINISHED, None)
        assert (loop.replicas[0].kv_pool.num_free, loop.replicas[0].embed_pool.num_free) == (NUM_PAGES, NUM_EMBEDS)
        return messages(loop, inst)[0], loop.replicas[0].interceptions.num_discarded, paused_state


@pytest.mark.parametrize("program", PROGRAMS)
def test_a_discarded_context_is_recomputed_by_the_sdk_token_for_token(inference, program):
    kept, num_discarded_kept, state_kept = paused_run(inference, program, "preserve")
    recomputed, num_discarded, state = paused_run(inference, program, "discard")
    assert (state_kept, num_discarded_kept, state, num_discarded) == ("preserved", 0, "discarded", 1)
    assert recomputed == kept
    assert len(kept.split()) == NEW


@pytest.fixture(scope="module")
def inference_with_a_small_host_tier():
    with tiny_inference(num_kv_pages=NUM_PAGES, num_host_pages=1) as process:
        yield process


def test_infercept_discards_a_long_pause_it_cannot_swap_and_the_sdk_recomputes_it(inference,
                                                                                   inference_with_a_small_host_tier):
    # A pause announced as 60 s wastes far more kept than recomputed; with a host tier too small to
    # swap to, the waste model's next choice is discard.
    kept, _, _ = paused_run(inference, "text-completion", "preserve")
    recomputed, num_discarded, state = paused_run(inference_with_a_small_host_tier, "text-completion", "infercept")
    assert (state, num_discarded, recomputed) == ("discarded", 1, kept)


def test_a_killed_instance_whose_pages_were_discarded_leaves_nothing_behind(inference):
    def kill(loop, inst):
        loop.kill(inst, "the test is over")
        assert (inst.state, loop.replicas[0].kv_pool.num_free, loop.replicas[0].host_pool.num_free) == (State.KILLED, NUM_PAGES, 16)
    paused_run(inference, "text-completion", "discard", then=kill)


def test_a_prefill_that_asks_for_no_distribution_is_no_recompute(inference):
    """--steps flushes the prompt but its last token in a forward that asks for no distribution: device
    time, and no recompute (oven stats showed it as "recomputing discarded K/V" beside 0 discarded)."""
    with control_loop(inference, None, ["text-completion"], interception_policy="preserve") as loop:
        inst = loop.launch("text-completion", [PROMPT, "2", "--steps"])
        assert loop.run_until(lambda: not inst.alive, 60) and inst.exit_code == 0
        stats = loop.snapshot()
    assert (stats.num_discarded, stats.rewrite_s, stats.rewrite_page_s) == (0, 0.0, 0.0) and stats.device_s > 0


def test_the_loop_measures_the_recompute_and_the_pages_a_pause_keeps(inference):
    def paused_for_a_while(policy: str):
        with control_loop(inference, None, ["text-completion"], interception_policy=policy) as loop:
            inst = loop.launch("text-completion", [PROMPT, str(NEW), "--pause", "60000"])
            assert loop.run_until(lambda: inst.io_idle and not loop.replicas[0].calls.has_calls(inst), 60)
            paused_at = time.monotonic()
            loop.run_until(lambda: time.monotonic() - paused_at > 0.5, 5)
            loop.deliver(inst.instance_id, "go on")
            assert loop.run_until(lambda: not inst.alive, 60)
            return loop.snapshot()
    kept, discarded = paused_for_a_while("preserve"), paused_for_a_while("discard")
    # Only forwards that rewrite restored pages (the SDK's recompute) count: none when the K/V was kept.
    assert (kept.rewrite_s, kept.num_discarded, discarded.num_discarded) == (0.0, 0, 1)
    assert 0 < discarded.rewrite_s < discarded.device_s
    # Recomputing's memory waste: the recompute batches' pages (this one instance's, 1 to NUM_PAGES of
    # them) for as long as they recomputed.
    assert kept.rewrite_page_s == 0.0
    assert discarded.rewrite_s <= discarded.rewrite_page_s <= NUM_PAGES * discarded.rewrite_s
    # The kept context held its ~10 pages through the half-second pause; the discarded one gave them back.
    assert kept.intercepted_page_s > 9 * 0.4
    assert discarded.intercepted_page_s < kept.intercepted_page_s / 4


def test_an_inferlet_on_the_raw_api_is_never_discarded(inference):
    # hello-python never says it can recompute its pages: `discard` preserves them.
    with control_loop(inference, None, ["hello-python"], interception_policy="discard") as loop:
        inst = loop.launch("hello-python", [PROMPT, str(NEW), "--pause"])
        assert loop.run_until(lambda: inst.io_idle and not loop.replicas[0].calls.has_calls(inst), 60)
        for _ in range(3):
            loop.step(0.001)
        assert (inst.record().shown_state, loop.replicas[0].interceptions.num_discarded) == ("preserved", 0)
        loop.deliver(inst.instance_id, "go on")
        assert loop.run_until(lambda: not inst.alive, 60)
        assert inst.state is State.FINISHED


def test_pages_with_calls_queued_or_in_flight_are_never_discarded(inference):
    with control_loop(inference, None, ["text-completion"], interception_policy="preserve") as loop:
        inst = loop.launch("text-completion", [PROMPT, str(NEW), "--pause", "60000"])
        assert loop.run_until(lambda: inst.io_idle and not loop.replicas[0].calls.has_calls(inst), 60)

        def discard_step(has_calls: bool) -> Interceptions:
            interceptions = Interceptions(InterceptionPolicy("discard"), loop.replicas[0].profiler, allocator=loop.replicas[0].allocator,
                                          kv_pool=loop.replicas[0].kv_pool, host_pool=loop.replicas[0].host_pool,
                                          page_size=loop.info.page_size, has_calls=lambda _: has_calls)
            interceptions.step([inst], time.monotonic())
            return interceptions
        assert (discard_step(True).num_discarded, inst.record().shown_state) == (0, "preserved")
        assert (discard_step(False).num_discarded, inst.record().shown_state) == (1, "discarded")


def test_a_forward_over_a_discarded_page_fails_before_any_device_work_until_restore_discarded(inference):
    with control_loop(inference, None, ["text-completion"], interception_policy="discard") as loop:
        inst = loop.launch("text-completion", [PROMPT, str(NEW), "--pause", "60000"])
        assert loop.run_until(lambda: inst.record().shown_state == "discarded", 60)
        pages = inst.resources.kvpage_handles()
        loop.replicas[0].allocator.swap_in(inst)  # what running it again does first: fresh masked pages
        assert loop.run_until(lambda: not inst.swapping, 30)
        assert {inst.resources.location(page) for page in pages} == {BLANK}

        def forward_text() -> Future:
            handle = forward.FUNCS["forward-text"](inst, 0, [1, 2], [0, 1], pages[:1], 2, [1], 1, 0)
            return inst.futures.get(handle)
        refused = forward_text()
        assert refused.done and refused.error.startswith(f"{KV_DISCARDED} kvpage handle {pages[0]} lost its K/V")
        assert not loop.replicas[0].calls.has_calls(inst)  # nothing was queued for the device
        assert kvpages.FUNCS["restore-discarded"](inst, pages[:1]) == pages[:1]
        rewritten = forward_text()
        assert loop.run_until(lambda: rewritten.done, 30)
        assert rewritten.error is None
        loop.kill(inst, "the test is over")
        assert loop.replicas[0].kv_pool.num_free == NUM_PAGES


def test_oven_serve_with_the_discard_policy_shows_and_counts_the_discard(inference, tmp_path):
    kept, _, _ = paused_run(inference, "text-completion", "preserve")
    srv = Server(tmp_path, "--num-kv-pages", str(NUM_PAGES), "--interception-policy", "discard",
                 "--program-dir", PROGRAM_DIR)
    try:
        with srv.client() as client:
            client.upload(built("text-completion"), "text-completion")
            instance_id = client.launch("text-completion", [PROMPT, str(NEW), "--pause", "60000"])
            deadline = time.monotonic() + 60
            while [e.state for e in client.instances() if e.instance_id == instance_id] != ["discarded"]:
                assert time.monotonic() < deadline, client.instances()
                time.sleep(0.05)
            assert (client.stats().num_discarded, client.stats().free_kv_pages) == (1, NUM_PAGES)
            client.send(instance_id, "go on")
            sent = []
            for event in client.events(poll_s=0.2):
                assert time.monotonic() < deadline + 60, "no message"
                if event is not None and event.instance_id == instance_id and event.kind in ("message", "exit"):
                    sent.append(event.text)  # the generated ids, sent before it exits
                    break
            assert (sent, wait_exit(client, instance_id).exit_code) == ([kept], 0)
            # What `oven stats` shows: the recompute's device time, and the cost profile learnt meanwhile.
            stats = client.stats()
            assert stats.interception_policy == "discard"
            assert 0 < stats.rewrite_s < stats.device_s and stats.rewrite_page_s >= stats.rewrite_s
            assert (stats.profile.recompute_measured, stats.profile.budget_measured) == (True, True)
            assert stats.profile.recompute_s_per_token > 0
    finally:
        srv.stop()


def test_a_discarded_instance_returning_to_a_full_pool_is_admitted_as_a_swapped_out_one(inference):
    kept, _, _ = paused_run(inference, "text-completion", "preserve")
    with control_loop(inference, None, ["text-completion"], interception_policy="discard") as loop:
        paused = loop.launch("text-completion", [PROMPT, str(NEW), "--pause", "60000"])
        assert loop.run_until(lambda: paused.record().shown_state == "discarded", 60)
        newer = loop.launch("text-completion", [PROMPT, str(NEW)])  # takes the pages the paused one gave up
        assert loop.run_until(lambda: loop.replicas[0].kv_pool.num_free < NUM_PAGES // 2, 60)
        loop.deliver(paused.instance_id, "go on")  # its pages do not fit now: the newer instance is preempted
        assert loop.run_until(lambda: not paused.alive and not newer.alive, 60)
        assert [(i.state, i.error, messages(loop, i)) for i in (paused, newer)] == [(State.FINISHED, None, [kept])] * 2
        assert loop.replicas[0].allocator.num_preempted >= 1
        assert (loop.replicas[0].kv_pool.num_free, loop.replicas[0].host_pool.num_free) == (NUM_PAGES, 16)
