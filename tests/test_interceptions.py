"""Intercepted instances in the control loop (control/runtime/interceptions.py): real inferlets, tiny model.

Two hello-python runs pause for a client message after their prefill: one needs 3 pages, the other
2, which fills the pool of 5; the interception policy then decides whether their pages stay on the
device while they wait.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from harness import PROGRAM_DIR, direct_greedy, tiny_inference

from oven.client.paths import inferlets_dir
from oven.control.config import ControlConfig
from oven.control.runtime.instance import State
from oven.control.runtime.interceptions import DEFAULT_EXPECTED_S, expected_return_at
from oven.control.runtime.loop import ControlLoop

NUM_PAGES, NUM_HOST_PAGES = 5, 8
PROMPT_A = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen"
PROMPT_B = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma"
RUNS = {PROMPT_A: 24, PROMPT_B: 8}  # 16 + 24 tokens on 3 pages, 23 + 8 on 2


def paused(io_wait_since, pause_until=None, mean_interception_s=None):
    return SimpleNamespace(io_wait_since=io_wait_since, pause_until=pause_until,
                           mean_interception_s=mean_interception_s)


def test_expected_return_comes_from_the_hint_then_the_measured_mean_then_the_default():
    assert expected_return_at(paused(10.0, pause_until=14.0, mean_interception_s=1.0), now=11.0) == 14.0
    assert expected_return_at(paused(10.0, mean_interception_s=3.0), now=11.0) == 13.0
    assert expected_return_at(paused(10.0), now=10.5) == 10.0 + DEFAULT_EXPECTED_S


def test_an_interception_past_its_expected_end_is_expected_to_last_as_long_again():
    # it said 1 s and has waited 5: it is now expected back in 5 s more (so it is the one swapped out)
    assert expected_return_at(paused(10.0, pause_until=11.0), now=15.0) == 20.0


@pytest.fixture(scope="module")
def inference():
    with tiny_inference(num_kv_pages=NUM_PAGES, num_host_pages=NUM_HOST_PAGES) as process:
        yield process


@pytest.fixture(scope="module")
def expected(inference):
    return {prompt: " ".join(map(str, direct_greedy(inference, None, prompt, new, num_pages=NUM_PAGES)))
            for prompt, new in RUNS.items()}


def run_paused_pair(inference, policy: str):
    events = []
    loop = ControlLoop(inference.client(), ControlConfig(program_dir=PROGRAM_DIR, interception_policy=policy),
                       lambda inst, kind, payload: events.append((inst.instance_id, kind, payload)))
    loop.programs.add((inferlets_dir() / "hello-python" / "hello-python.wasm").read_bytes(), "hello-python")
    runs = [loop.launch("hello-python", [prompt, str(new), "--pause"]) for prompt, new in RUNS.items()]
    assert loop.run_until(lambda: all(r.io_idle for r in runs), 60)
    return loop, runs, events


def finish(loop, runs, events, expected) -> None:
    for run in runs:
        run.inbox.push("go on")
    assert loop.run_until(lambda: not any(r.alive for r in runs), 60)
    outputs = [next(p for i, k, p in events if i == r.instance_id and k == "message") for r in runs]
    assert ([r.state for r in runs], outputs) == ([State.FINISHED] * 2, list(expected.values()))
    assert (loop.replicas[0].kv_pool.num_free, loop.replicas[0].host_pool.num_free) == (NUM_PAGES, NUM_HOST_PAGES)
    loop.close()


def test_infercept_swaps_paused_instances_out_of_a_full_pool_and_back_with_the_same_tokens(inference, expected):
    loop, runs, events = run_paused_pair(inference, "infercept")
    assert loop.run_until(lambda: all(r.record().shown_state == "swapped" for r in runs), 30)
    assert (loop.replicas[0].kv_pool.num_free, loop.replicas[0].host_pool.num_free) == (NUM_PAGES, NUM_HOST_PAGES - NUM_PAGES)
    assert loop.replicas[0].interceptions.num_swapped_out == 2
    # The copies took time, which counts against the pages of whoever was not paused (at most the pool).
    snapshot = loop.snapshot()
    assert snapshot.copy_s > 0 and 0 <= snapshot.copy_page_s <= NUM_PAGES * snapshot.copy_s
    finish(loop, runs, events, expected)


def test_preserve_keeps_paused_instances_on_the_device(inference, expected):
    loop, runs, events = run_paused_pair(inference, "preserve")
    for _ in range(20):  # the policy is asked every turn; under `preserve` nothing moves
        loop.step(0.005)
    assert [r.record().shown_state for r in runs] == ["preserved", "preserved"]
    assert (loop.replicas[0].kv_pool.num_free, loop.replicas[0].host_pool.num_free, loop.replicas[0].interceptions.num_swapped_out) == (
        0, NUM_HOST_PAGES, 0)
    assert (loop.replicas[0].interceptions.copy_s, loop.replicas[0].interceptions.copy_page_s) == (0.0, 0.0)
    finish(loop, runs, events, expected)


def test_a_killed_swapped_out_instance_gives_its_host_slots_back(inference):
    loop, runs, _ = run_paused_pair(inference, "swap")
    assert loop.run_until(lambda: all(r.record().shown_state == "swapped" for r in runs), 30)
    loop.kill(runs[0], "the test is over")
    assert (loop.replicas[0].host_pool.num_free, runs[0].state) == (NUM_HOST_PAGES - 2, State.KILLED)
    loop.kill(runs[1], "the test is over")
    assert (loop.replicas[0].kv_pool.num_free, loop.replicas[0].host_pool.num_free) == (NUM_PAGES, NUM_HOST_PAGES)
    loop.close()
