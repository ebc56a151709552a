"""Runner processes: one client's inferlets cannot freeze, exhaust or crash another's (issue 40, rows 2-6).

Two clients share one ControlLoop over a real inference process (tiny model): ``mallory`` misbehaves,
``alice`` runs an ordinary decode, and each test shows alice's tokens exact and mallory contained.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from harness import built, control_loop, direct_greedy, messages, rss_mib

from oven.control.runtime.instance import State
from oven.control.runtime.programs import LIBRARY

PROMPT, NUM_TOKENS = "The quick brown fox", 24
WASM_TOOLS = Path(sys.executable).parent / "wasm-tools"


@contextmanager
def two_client_loop(inference, **overrides):
    with control_loop(inference, None, [], **overrides) as control:
        for name in ("hello-python", "hostile"):  # the library: every client may launch them
            control.programs.add(built(name), name, namespace=LIBRARY)
        yield control


@pytest.fixture(scope="module")
def loop(inference):
    with two_client_loop(inference, runner_grace_s=4.0) as control:
        yield control


@pytest.fixture(scope="module")
def expected(inference, loop) -> str:
    return " ".join(map(str, direct_greedy(inference, loop, PROMPT, NUM_TOKENS)))


def alice_runs(loop, expected: str, while_running=lambda: None):
    """Alice's decode to its end, ``while_running()`` called on each turn; asserts its exact tokens."""
    inst = loop.launch("hello-python", [PROMPT, str(NUM_TOKENS)], owner="alice")
    seen = []
    assert loop.run_until(lambda: seen.append(while_running()) or not inst.alive, 120)
    assert (inst.state, inst.error, messages(loop, inst)) == (State.FINISHED, None, [expected])
    return inst, seen


def test_each_client_has_a_runner_of_its_own(loop, expected):
    mallory = loop.launch("hostile", ["deaf"], owner="mallory")
    alice, _ = alice_runs(loop, expected)
    assert alice.runner.pid != mallory.runner.pid and alice.runner.client == "alice"
    loop.terminate(mallory.instance_id, "test over")


def test_spinning_launches_of_one_client_hold_up_nothing_of_another(loop, expected):
    """Six instances whose start spins to the slice deadline (1 s each, one after another in mallory's
    runner) are still spinning when alice's decode, launched after them, has finished."""
    spinners = [loop.launch("hostile", ["spin"], owner="mallory") for _ in range(6)]
    alice, _ = alice_runs(loop, expected)
    assert sum(s.alive for s in spinners) >= 3
    assert loop.run_until(lambda: not any(s.alive for s in spinners), 60)
    assert all(s.state is State.FAILED and "slice ran past the 1000 ms deadline" in s.error for s in spinners)
    # each spun its whole slice: the CPU `oven ps` shows for it (InstanceRecord.cpu_s) is more than a
    # whole decode's; not a fixed figure, since a loaded machine gives a spinning second less CPU
    alice_cpu_s = loop.ended(alice.instance_id).cpu_s
    assert 0 < alice_cpu_s < min(loop.ended(s.instance_id).cpu_s for s in spinners)


LAUNCHES = 60  # they must outlast the decode's token's round trip (wave wait included): 30 did not always


def test_a_clients_launches_wait_behind_its_running_instances(loop, expected):
    """Sixty launches ordered while alice's decode waits for the device: the slice its next token wakes
    runs before the last of them. A Python launch takes 5-30 ms of the runner's one thread; run in the
    order they were ordered, every token of a running decode waited for every launch queued before it,
    and the launches' slices held the device's next batch back (512 launches of one client made 10 s in
    which its running instances could not call the device)."""
    decode = loop.launch("hello-python", [PROMPT, str(NUM_TOKENS)], owner="alice")
    assert loop.run_until(lambda: decode.started and decode.state is State.WAITING, 60)
    ran, slices_ran = [], loop._slices_ran

    def record(runner, results):  # the order alice's runner ran slices in
        ran.extend(x.instance_id for x in results)
        slices_ran(runner, results)

    loop._slices_ran = record
    try:
        launched = [loop.launch("hello-python", [PROMPT, "1"], owner="alice") for _ in range(LAUNCHES)]
        assert loop.run_until(lambda: not decode.alive and not any(x.alive for x in launched), 120)
    finally:
        del loop._slices_ran
    assert (decode.state, messages(loop, decode)) == (State.FINISHED, [expected])
    last_launch = max(ran.index(x.instance_id) for x in launched)
    assert ran.index(decode.instance_id) < last_launch


def test_launches_ended_before_they_ran_are_answered_without_running(loop, expected):
    """Six launches queued behind a spinning one and ended meanwhile: the runner drops them when it hears
    so and answers each (every slice ordered is answered, else the runner would look hung); the runner
    serves on, and alice's decode is exact."""
    spinner = loop.launch("hostile", ["spin"], owner="mallory")
    queued = [loop.launch("hello-python", [PROMPT, "1"], owner="mallory") for _ in range(6)]
    loop.step(0)  # every launch ordered: the spinner's first, so the others wait in the runner's queue
    assert spinner.in_slice and all(x.in_slice for x in queued)
    runner = spinner.runner
    for inst in queued:
        loop.terminate(inst.instance_id, "ended by its client")
    alice_runs(loop, expected)
    assert loop.run_until(lambda: not spinner.alive and runner.num_in_slice == 0, 60)
    assert all((x.state, x.error, messages(loop, x)) == (State.KILLED, "ended by its client", []) for x in queued)
    again = loop.launch("hello-python", [PROMPT, "1"], owner="mallory")
    assert loop.run_until(lambda: not again.alive, 60)
    assert (again.state, again.runner, runner.proc.poll()) == (State.FINISHED, runner, None)


def test_a_tokenize_past_the_limit_fails_alone(loop, expected):
    big = loop.launch("hostile", ["tokenize", str(60 << 10)], owner="mallory")
    small = loop.launch("hostile", ["tokenize", "64"], owner="mallory")
    alice_runs(loop, expected)
    assert loop.run_until(lambda: not big.alive and not small.alive, 60)
    assert big.state is State.FAILED and "tokenize: 62914560 bytes of text, past the limit of 4 MiB" in big.error
    # "ab" and " ab" are one token each, the last space another
    assert (small.state, small.error, messages(loop, small)) == (State.FINISHED, None, [f"{(64 << 10) // 3 + 1} tokens"])


def test_a_component_with_many_memories_fails_to_start_alone(loop, expected, tmp_path):
    """Ten core instances of a ten-memory module: past the store's limit of memories, its launch fails
    (each memory used to reserve 6 GiB of address space: 47 such launches took 128 TiB)."""
    wat = "(component (core module $m {}) {})".format("(memory 1)" * 10, "(core instance (instantiate $m))" * 10)
    (tmp_path / "many.wat").write_text(wat)
    subprocess.run([WASM_TOOLS, "parse", tmp_path / "many.wat", "-o", tmp_path / "many.wasm"], check=True)
    digest = loop.programs.add((tmp_path / "many.wasm").read_bytes(), uploader="mallory")
    many = [loop.launch(digest, [], owner="mallory") for _ in range(8)]
    alice_runs(loop, expected)
    assert loop.run_until(lambda: not any(m.alive for m in many), 60)
    assert all(m.state is State.FAILED and m.error.startswith("launch failed: ") and "memory" in m.error
               for m in many)


def test_a_client_past_its_memory_fails_alone(inference, expected):
    """Eight instances that each grow 16 MiB at a time until they may not: one alone stops at the 192 MiB
    an instance may have, but eight together pass mallory's share (512 MiB), so its runner ends the
    largest as they pass it and the rest go on; alice decodes meanwhile, the control process holds none
    of it, and mallory's runner lives on: its next launch runs there."""
    with two_client_loop(inference, client_memory_mib=512) as loop:
        control_rss = rss_mib(os.getpid())
        hogs = [loop.launch("hostile", ["hoard"], owner="mallory") for _ in range(8)]
        alice_runs(loop, expected)
        assert loop.run_until(lambda: not any(h.alive for h in hogs), 120)
        assert all(h.state is State.FAILED and ": out of memory, " in h.error for h in hogs)
        assert any("this client's instances together reached their share" in h.error for h in hogs)
        assert rss_mib(os.getpid()) < control_rss + 64
        runner = hogs[0].runner
        again = loop.launch("hello-python", [PROMPT, str(NUM_TOKENS)], owner="mallory")
        assert loop.run_until(lambda: not again.alive, 120)
        assert (again.state, messages(loop, again), again.runner) == (State.FINISHED, [expected], runner)
        assert runner.proc.poll() is None and runner.num_in_slice == 0


def test_kill_9_of_a_runner_ends_its_instances_alone(loop, expected):
    deaf = [loop.launch("hostile", ["deaf"], owner="mallory") for _ in range(3)]
    assert loop.run_until(lambda: all(d.state is State.WAITING for d in deaf), 60)
    pid = deaf[0].runner.pid
    killed = []

    def kill_once():
        if not killed:
            os.kill(pid, signal.SIGKILL)
            killed.append(time.monotonic())

    alice_runs(loop, expected, kill_once)
    assert all(d.state is State.KILLED and d.error == "its runner process died: killed by signal 9" for d in deaf)
    again = loop.launch("hostile", ["deaf"], owner="mallory")  # a runner of its own again
    assert loop.run_until(lambda: again.state is State.WAITING, 60) and again.runner.pid != pid
    loop.terminate(again.instance_id, "test over")


def test_a_runner_that_stops_answering_is_killed(loop, expected):
    """A runner stopped (SIGSTOP) while it has a slice to run is killed once a slice and the grace have
    passed (1 s and 4 s here), and its instance ends with why."""
    first = loop.launch("hostile", ["deaf"], owner="mallory")
    assert loop.run_until(lambda: first.state is State.WAITING, 60)
    os.kill(first.runner.pid, signal.SIGSTOP)
    stuck = loop.launch("hostile", ["deaf"], owner="mallory")
    alice_runs(loop, expected)
    assert loop.run_until(lambda: not stuck.alive, 30)
    assert stuck.state is State.KILLED and stuck.error.startswith("its runner process died: it said nothing for ")
    assert not first.alive


class _Judge:
    """A supervisor that only records what the loop concludes about its inference process."""

    def __init__(self):
        self.killed: list[str] = []

    def kill(self, reason: str) -> None:
        self.killed.append(reason)

    def check(self, now: float) -> None:
        return None


def test_a_stall_of_the_loop_itself_is_not_taken_for_a_hung_inference_process(inference, expected):
    """The loop stops for longer than the inference timeout while a batch is in flight (as a 60 MB
    tokenize on its thread once made it): the reply that came meanwhile is read before the batch is
    judged, so the healthy inference process is not killed (row 3)."""
    with two_client_loop(inference, inference_timeout_s=1.0) as loop:
        loop.replicas[0].supervisor = judge = _Judge()
        inst = loop.launch("hello-python", [PROMPT, str(NUM_TOKENS)], owner="alice")
        assert loop.run_until(lambda: loop.replicas[0].calls.num_in_flight > 0, 60)
        time.sleep(1.5)
        assert loop.run_until(lambda: not inst.alive, 60)
        assert (inst.state, messages(loop, inst), judge.killed) == (State.FINISHED, [expected], [])
