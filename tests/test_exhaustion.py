"""Pool exhaustion policies with real inferlets over a small KvPage pool (tiny model).

Each hello-python run below needs 3 pages of 16 tokens (prompt + new tokens);
the pool has 5, so a second concurrent run cannot get its pages.
"""

from __future__ import annotations

import pytest
from harness import PROGRAM_DIR, direct_greedy, tiny_inference

from oven.client.paths import inferlets_dir
from oven.control.config import ControlConfig
from oven.control.runtime.instance import State
from oven.control.runtime.loop import ControlLoop
from oven.control.tokenizer import Tokenizer

NUM_PAGES = 5
PROMPT_A = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen"
PROMPT_B = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma"
NEW = 24


@pytest.fixture(scope="module")
def inference():
    with tiny_inference(num_kv_pages=NUM_PAGES, num_host_pages=8) as process:
        yield process


@pytest.fixture(scope="module")
def expected(inference):
    return {prompt: " ".join(map(str, direct_greedy(inference, None, prompt, NEW, num_pages=NUM_PAGES)))
            for prompt in (PROMPT_A, PROMPT_B)}


def make_loop(inference, policy: str, programs=("hello-python", "prefix-cache"), **config):
    events = []
    loop = ControlLoop(inference.client(), ControlConfig(program_dir=PROGRAM_DIR, exhaustion_policy=policy,
                                                         **config),
                       lambda inst, kind, payload: events.append((inst.instance_id, kind, payload)))
    for name in programs:
        loop.programs.add((inferlets_dir() / name / f"{name}.wasm").read_bytes(), name)
    loop.events = events
    return loop


def messages(loop, inst) -> list[str]:
    return [p for i, k, p in loop.events if i == inst.instance_id and k == "message"]


def message(loop, inst) -> str | None:
    found = messages(loop, inst)
    return found[0] if found else None


def test_each_run_needs_three_pages(inference):
    tok = Tokenizer(inference.info.tokenizer)
    for prompt in (PROMPT_A, PROMPT_B):
        assert 32 < len(tok.encode(prompt)) + NEW <= 48


def settle(loop, *instances) -> None:
    assert loop.run_until(lambda: not any(i.alive for i in instances), 120)


def test_terminate_newest_kills_the_newcomer(inference, expected):
    loop = make_loop(inference, "terminate-newest")
    old = loop.launch("hello-python", [PROMPT_A, str(NEW)])
    loop.run_until(lambda: old.resources.num_kvpages > 0, 30)
    new = loop.launch("hello-python", [PROMPT_B, str(NEW)])
    settle(loop, old, new)
    assert message(loop, old) == expected[PROMPT_A]
    assert new.state is State.KILLED and "exhausted" in new.error
    assert loop.replicas[0].kv_pool.num_free == NUM_PAGES
    loop.close()


def test_wait_parks_the_allocation_until_pages_return(inference, expected):
    loop = make_loop(inference, "wait")
    first = loop.launch("hello-python", [PROMPT_A, str(NEW)])
    loop.run_until(lambda: first.resources.num_kvpages > 0, 30)
    second = loop.launch("hello-python", [PROMPT_B, str(NEW)])
    settle(loop, first, second)
    assert (message(loop, first), message(loop, second)) == (expected[PROMPT_A], expected[PROMPT_B])
    assert loop.replicas[0].kv_pool.num_free == NUM_PAGES
    loop.close()


def test_offload_swaps_out_an_instance_waiting_on_io(inference, expected):
    """A paused instance's pages go to the host tier, the newcomer runs, then the paused one resumes intact."""
    loop = make_loop(inference, "offload")
    paused = loop.launch("hello-python", [PROMPT_A, str(NEW), "--pause"])
    assert loop.run_until(lambda: paused.io_idle, 30)
    newcomer = loop.launch("hello-python", [PROMPT_B, str(NEW)])
    settle(loop, newcomer)
    assert message(loop, newcomer) == expected[PROMPT_B]
    assert paused.resources.num_offloaded == 3 and loop.replicas[0].host_pool.num_free == 8 - 3
    paused.inbox.push("go on")
    settle(loop, paused)
    assert message(loop, paused) == expected[PROMPT_A]
    assert loop.replicas[0].kv_pool.num_free == NUM_PAGES and loop.replicas[0].host_pool.num_free == 8
    loop.close()


def test_an_ended_exporters_export_is_dropped_before_anyone_is_terminated(inference, expected):
    """prefix-cache leaves 3 of the 5 pages in an export; a newcomer needing 3 gets them from it."""
    loop = make_loop(inference, "terminate-newest")
    prefix = f"{PROMPT_A} {PROMPT_B}"
    # The export holds what a flush forwards: every prefix token but the last, on 3 pages.
    assert 32 < len(Tokenizer(inference.info.tokenizer).encode(prefix)) - 1 <= 48
    exporter = loop.launch("prefix-cache", [prefix, "go", "2"])
    settle(loop, exporter)
    assert exporter.exit_code == 0, exporter.error
    ((name, num_pages),) = loop.replicas[0].exports.list_exports()
    assert num_pages == 3 and loop.replicas[0].kv_pool.num_free == NUM_PAGES - 3
    newcomer = loop.launch("hello-python", [PROMPT_B, str(NEW)])
    settle(loop, newcomer)
    assert message(loop, newcomer) == expected[PROMPT_B]
    assert name not in loop.replicas[0].exports and loop.replicas[0].kv_pool.num_free == NUM_PAGES
    loop.close()


def test_pages_an_operator_frees_go_to_the_waiting_allocation(inference, expected):
    """Under `wait`, dropping an export (what `oven exports --drop` does) hands its pages to the parked call."""
    loop = make_loop(inference, "wait")
    holder = loop.launch("hello-python", [PROMPT_A, str(NEW), "--pause"])
    assert loop.run_until(lambda: holder.io_idle, 30)
    handles = holder.resources.exclusive_device_handles()
    loop.replicas[0].exports.export_kvpages(holder.resources, "held", handles, holder.owner)
    holder.resources.dealloc_kvpages(handles)  # the export alone holds the 3 pages; its exporter still runs
    waiter = loop.launch("hello-python", [PROMPT_B, str(NEW)])
    assert loop.run_until(lambda: getattr(waiter, "blocked_since", None) is not None, 30)
    loop.drop_export("held")
    settle(loop, waiter)
    assert message(loop, waiter) == expected[PROMPT_B]
    loop.kill(holder, "the test is over")
    assert loop.replicas[0].kv_pool.num_free == NUM_PAGES
    loop.close()


def test_preempt_runs_more_instances_than_the_pool_holds_with_the_outputs_of_a_big_pool(inference, expected):
    """Six completions on 5 pages (each needs 3, the SDK allocates as it goes): none is killed, each
    output is the one a pool big enough for all gives, and every page and host slot comes back."""
    loop = make_loop(inference, "preempt", ("text-completion",))
    prompts = [PROMPT_A, PROMPT_B] * 3
    runs = [loop.launch("text-completion", [prompt, str(NEW)]) for prompt in prompts]
    settle(loop, *runs)
    assert [(r.state, message(loop, r)) for r in runs] == [(State.FINISHED, expected[p]) for p in prompts]
    assert (loop.replicas[0].kv_pool.num_free, loop.replicas[0].host_pool.num_free, loop.replicas[0].allocator.num_waiting) == (NUM_PAGES, 8, 0)
    loop.close()


def test_preempt_swaps_out_the_newer_instance_and_resumes_it_intact(inference, expected):
    """The newer instance holds pages, stopped mid-generation; the older one needs them: the newer is
    swapped to the host tier (not killed), and finishes with the same tokens once it runs again."""
    loop = make_loop(inference, "preempt", ("text-completion",))
    old = loop.launch("text-completion", [PROMPT_A, str(NEW)])
    new = loop.launch("text-completion", [PROMPT_B, str(NEW)])
    loop.hold_output(old.instance_id, True)
    assert loop.run_until(lambda: new.resources.num_kvpages >= 3, 30)
    loop.hold_output(new.instance_id, True)  # it stops between two slices, holding 3 of the 5 pages
    loop.hold_output(old.instance_id, False)
    settle(loop, old)
    assert message(loop, old) == expected[PROMPT_A]
    assert (loop.replicas[0].allocator.num_preempted, new.resources.num_offloaded, loop.replicas[0].host_pool.num_free) == (1, 3, 5)
    loop.hold_output(new.instance_id, False)
    settle(loop, new)
    assert (new.state, message(loop, new)) == (State.FINISHED, expected[PROMPT_B])
    assert (loop.replicas[0].kv_pool.num_free, loop.replicas[0].host_pool.num_free) == (NUM_PAGES, 8)
    loop.close()


def test_a_client_holding_the_pool_and_host_tier_gives_way_to_another_client(inference, expected):
    """Client a's three instances take all 5 KvPages and all 8 host slots, then wait (on a client message
    here; a timer is the same to the policy). Client b's newcomer still starts and gets the 3 pages of its
    share (half the pool, rounded up), with the output a pool of its own gives: a's most wasteful idle
    holder ends with a clear error (the host tier has no room for its pages), which makes room to swap
    out the next; that one resumes intact later, and so does the third, untouched. Every page and host
    slot comes back."""
    loop = make_loop(inference, "preempt", (), interception_policy="preserve")  # no swap of its own
    for name in ("hostile", "hello-python"):
        for client in ("a", "b"):
            loop.programs.add((inferlets_dir() / name / f"{name}.wasm").read_bytes(), name, uploader=client)
    hoarders = []
    for device, host in ((2, 3), (2, 3), (1, 2)):  # the host tier's pages pass through the device one at a time
        hoarder = loop.launch("hostile", ["hold-kv", str(device), str(host)], owner="a")
        assert loop.run_until(lambda: hoarder.io_idle or not hoarder.alive, 60)
        assert messages(loop, hoarder) == [f"holding {device} + {host}"]
        hoarders.append(hoarder)
    assert (loop.replicas[0].kv_pool.num_free, loop.replicas[0].host_pool.num_free) == (0, 0)
    newcomer = loop.launch("hello-python", [PROMPT_B, str(NEW)], owner="b")
    settle(loop, newcomer)
    assert (newcomer.state, message(loop, newcomer)) == (State.FINISHED, expected[PROMPT_B])
    ended, swapped, kept = hoarders
    assert (ended.state, ended.error) == (State.KILLED, "terminated: its client 'a' held 5 of the 5 KvPages, more "
                                                        "than its fair share of 3, while client 'b' waited for "
                                                        "pages, and the host tier had no room for its pages")
    assert swapped.alive and swapped.resources.num_offloaded == 5 and kept.resources.num_offloaded == 2
    assert loop.replicas[0].allocator.num_preempted == 1
    for hoarder in (swapped, kept):
        hoarder.inbox.push("go on")
    settle(loop, swapped, kept)
    assert [(h.state, messages(loop, h)[-1]) for h in (swapped, kept)] == [(State.FINISHED, "released")] * 2
    assert (loop.replicas[0].kv_pool.num_free, loop.replicas[0].host_pool.num_free, loop.replicas[0].allocator.num_waiting) == (NUM_PAGES, 8, 0)
    loop.close()
