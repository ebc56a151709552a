"""Inferlets in wasmtime over a real inference process (tiny model): results, batching, isolation."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness import assert_pools_full, direct_greedy, messages, rss_mib, run

import oven.proto
from oven.control.runtime import futures as futures_module
from oven.control.runtime.instance import State


PROGRAMS = ["hello-python", "hello-rust", "hostile"]  # stored in the module's ControlLoop (the `loop` fixture, conftest.py)


@pytest.mark.parametrize("program", ["hello-python", "hello-rust"])
@pytest.mark.parametrize("flags", [[], ["--fused"]], ids=["three-calls", "forward-text"])
def test_raw_api_inferlets_equal_direct_greedy(loop, inference, program, flags):
    (inst,) = run(loop, program, [["The quick brown fox", "10", *flags]])
    assert (inst.state, inst.exit_code) == (State.FINISHED, 0)
    expected = direct_greedy(inference, loop, "The quick brown fox", 10)
    assert messages(loop, inst) == [" ".join(map(str, expected))]
    assert_pools_full(loop)


@pytest.mark.parametrize("program", ["hello-python", "hello-rust"])
def test_wasm_clock_counts_host_calls_and_inferlet_code(loop, inference, program):
    """Each extra token of the fused loop is exactly two host calls (forward-text, take-dists)."""
    counts = []
    for num_tokens in (4, 8):
        clock = loop.wasm_clock
        calls, in_wasm, in_host = clock.host_calls, clock.in_wasm_ns, clock.in_host_ns
        (inst,) = run(loop, program, [["The quick brown fox", str(num_tokens), "--fused"]])
        assert len(messages(loop, inst)[0].split()) == num_tokens  # no stop token cut it short
        counts.append(clock.host_calls - calls)
        assert clock.in_host_ns > in_host and clock.in_wasm_ns - in_wasm > clock.in_host_ns - in_host
    assert counts[1] - counts[0] == 2 * 4


def test_64_concurrent_inferlets_match_solo_runs_and_batch(loop, inference):
    prompts = [f"Sequence {i}: {'abc ' * (i % 7)}" for i in range(64)]
    before = loop.replicas[0].scheduler.stats()
    instances = run(loop, "hello-python", [[prompt, "6"] for prompt in prompts])
    after = loop.replicas[0].scheduler.stats()
    assert all(i.exit_code == 0 for i in instances)
    for inst, prompt in zip(instances, prompts):
        assert messages(loop, inst) == [" ".join(map(str, direct_greedy(inference, loop, prompt, 6)))]
    assert after.num_horizontal_batches > before.num_horizontal_batches
    assert after.num_vertical_batches > before.num_vertical_batches
    batches = after.num_batches - before.num_batches
    assert batches < (after.num_commands - before.num_commands) / 4  # real batching, not one call per batch
    assert_pools_full(loop)


def test_instances_in_lockstep_decode_in_one_batch_a_round(loop, inference):
    """16 fused loops woken by one reply run in their runner before the adaptive policy dispatches, so
    each decode round is one batch of all 16 (the policy split every round in two before: 24 batches for
    these 144 commands, 6 items on average). The first calls may go out in a few parts: the 16 starts run
    one after another in the client's runner (an instantiation and a start slice each, milliseconds),
    and their first pages' masks go out as they come."""
    before = loop.replicas[0].scheduler.stats()
    instances = run(loop, "hello-python", [[f"Sequence {i:02d}: the same length", "8", "--fused"] for i in range(16)])
    after = loop.replicas[0].scheduler.stats()
    assert all(i.exit_code == 0 for i in instances)
    sizes = dict(after.batch_size_histogram)
    for size, count in before.batch_size_histogram:
        sizes[size] -= count
    assert after.num_commands - before.num_commands == 144 and sizes[16] >= 7  # mask, prefill, 7 decode rounds
    assert after.num_batches - before.num_batches <= 7 + 16  # the decode rounds, the first calls as they come


@pytest.mark.parametrize("mode, fragment", [
    ("forged", "never allocated here"),
    ("double-free", "already freed"),
    ("use-after-free", "already freed"),
    ("quota", "quota exceeded"),
])
def test_bad_handles_get_errors(loop, mode, fragment):
    (inst,) = run(loop, "hostile", [[mode]])
    assert (inst.state, inst.exit_code) == (State.FINISHED, 3)
    (message,) = messages(loop, inst)
    assert message.startswith("error: ") and fragment in message
    assert_pools_full(loop)


@pytest.mark.parametrize("mode, fragment", [
    ("spin", "wasm trap: interrupt: one slice ran past the 1000 ms deadline"),  # the harness's slice_ms
    ("memory", "out of memory, the instance's limit is 192 mib"),  # the harness's instance_memory_mib
    ("trap", "runtimeerror: hostile inferlet gave up"),
    ("early-take", "has not completed yet"),  # a host function's own error kills the caller
    ("export-trap", "exported, then gave up"),  # its export goes with it (assert_pools_full)
])
def test_hostile_instances_die_alone(loop, inference, mode, fragment):
    """A spinning, memory-hungry or crashing inferlet is killed while a well-behaved one finishes."""
    hostile = loop.launch("hostile", [mode])
    (good,) = run(loop, "hello-python", [["Still fine", "5"]])
    assert loop.run_until(lambda: not hostile.alive, 60)
    assert hostile.state is State.FAILED and hostile.exit_code == 1
    assert fragment in hostile.error.lower()
    assert good.exit_code == 0
    assert messages(loop, good) == [" ".join(map(str, direct_greedy(inference, loop, "Still fine", 5)))]
    assert_pools_full(loop)


def wit_functions_with_parameters() -> set[str]:
    """``interface.function`` for every imported WIT function that takes arguments, snake_case as bound."""
    text = (Path(oven.proto.__file__).parent / "wit" / "oven.wit").read_text()
    found = set()
    for interface, body in re.findall(r"^interface ([a-z-]+) \{(.*?)^\}", text, re.M | re.S):
        for name in re.findall(r"^\s*([a-z-]+): func\((?!\))", body, re.M):
            found.add(f"{interface}.{name}".replace("-", "_"))
    return found


def test_a_wrongly_typed_argument_to_any_host_function_raises_in_the_guest(loop):
    """Every host function that takes arguments, given a wrong type first, raises a TypeError the guest
    catches (sdk/python/host_boundary.py) where the lowering used to trap the whole component."""
    (inst,) = run(loop, "hostile", [["bad-types"]])
    assert (inst.state, inst.exit_code) == (State.FINISHED, 0), inst.error
    expected = wit_functions_with_parameters()
    assert len(expected) > 40  # every interface, not a few
    assert sorted(messages(loop, inst)) == sorted(f"{name} TypeError" for name in expected)


@pytest.mark.parametrize("program, args", [("hostile", ["memory"]), ("hostile", ["early-take"])],
                         ids=["trapped-at-its-memory-limit", "killed-by-a-host-call"])
def test_an_ended_instance_frees_its_memory_at_once(loop, program, args):
    """Its linear memory goes when it ends, in its runner, not when a cyclic collector next runs a full
    pass: eight instances that each fill the 192 MiB the harness allows leave the runner as they found it."""
    (first,) = run(loop, program, args)
    runner = first.runner
    baseline = rss_mib(runner.pid)
    for _ in range(8):
        (inst,) = run(loop, program, args)
        assert inst.state is State.FAILED and inst.runner is runner
        assert rss_mib(runner.pid) < baseline + 64


def test_an_ended_instance_leaves_no_timers(loop):
    """Sleeps an inferlet never waited for go with it: a far deadline must not keep it in memory."""
    before = len(loop.timers)
    (inst,) = run(loop, "hostile", [["sleepers", "100"]])
    assert (inst.state, inst.exit_code, messages(loop, inst)) == (State.FINISHED, 0, ["100 sleeps started"])
    assert len(loop.timers) == before


def test_an_instance_past_max_futures_dies_alone(loop, monkeypatch):
    monkeypatch.setattr(futures_module, "MAX_FUTURES", 50)
    before = len(loop.timers)
    (inst,) = run(loop, "hostile", [["sleepers", "100"]])
    assert inst.state is State.FAILED and "50 futures are held already" in inst.error
    assert len(loop.timers) == before
    assert_pools_full(loop)
