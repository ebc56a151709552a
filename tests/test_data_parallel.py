"""Data parallel serving: one control loop over several inference replicas (control/runtime/replica.py,
placement.py; oven serve --data-parallel N).

Each replica is a real inference process of the same seeded model; greedy tokens must not depend on
which replica an instance lands on, nor on how many there are.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest
from harness import OVEN, PROGRAM_DIR, Server, built, control_loop, direct_greedy, messages, run, tiny_inference
from oven.control.config import ControlConfig
from oven.control.runtime.instance import State
from oven.control.runtime.loop import ControlLoop
from oven.control.supervisor import InferenceSupervisor
from oven.control.tokenizer import Tokenizer
from oven.inference.config import DEFAULT_MODEL, InferenceConfig

PROMPTS = [f"Replica test {i}: {'once upon a time ' * (i % 3)}" for i in range(8)]
NEW = 12


@pytest.fixture(scope="module")
def second():
    """The second replica beside the module's ``inference`` (the tiny model, the same seed)."""
    with tiny_inference() as process:
        yield process


def expected(inference, prompt: str, max_new: int = NEW) -> str:
    return " ".join(map(str, direct_greedy(inference, None, prompt, max_new)))


def test_instances_spread_over_both_replicas_and_decode_as_on_one(inference, second):
    with control_loop([inference, second], None, ["hello-python"]) as loop:
        instances = run(loop, "hello-python", [[prompt, str(NEW)] for prompt in PROMPTS])
        batches = [replica.scheduler.stats() for replica in loop.replicas]
        stats = loop.snapshot()
    assert [inst.replica.index for inst in instances] == [0, 1] * 4  # least loaded, ties in turn
    assert all(s.num_batches > 0 and s.num_vertical_batches > 0 for s in batches)  # each decodes its own batches
    assert [r.num_instances for r in stats.replicas] == [0, 0]
    assert stats.stats.num_batches == sum(s.num_batches for s in batches)
    assert [messages(loop, inst) for inst in instances] == [[expected(inference, p)] for p in PROMPTS]


def test_smollm2_on_two_replicas_equals_one(tmp_path):
    config = dict(model=DEFAULT_MODEL, num_kv_pages=64)
    prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time", "List three colours:"]
    with tiny_inference(**config) as a, tiny_inference(**config) as b:
        outputs = []
        for replicas in ([a], [a, b]):
            with control_loop(replicas, None, ["hello-python"], adapter_dir=str(tmp_path)) as loop:
                instances = run(loop, "hello-python", [[prompt, "16"] for prompt in prompts], timeout_s=300)
                outputs.append([messages(loop, inst) for inst in instances])
                assert sorted({inst.replica.index for inst in instances}) == list(range(len(replicas)))
        # the packaged AsyncLM adapter, loaded once both replicas took it
        assert [(e.name, e.state, e.waiting) for e in loop.adapters.entries()] == [("asynclm", "loaded", set())]
    assert outputs[0] == outputs[1] and all(len(m[0].split()) == 16 for m in outputs[0])


def test_an_import_moves_an_instance_not_placed_yet_and_one_placed_recomputes(inference, second):
    prefix = "A shared system prompt that spans more than one page of sixteen tokens, and then some more."
    with control_loop([inference, second], None, ["prefix-cache"]) as loop:
        (first,) = run(loop, "prefix-cache", [[prefix, "suffix one", "6"]])
        assert first.replica.index == 0 and len(loop.exports()) == 1
        # the export's pages load replica 0: the next instances are placed on replica 1 first
        mover = loop.launch("prefix-cache", [prefix, "suffix two", "6"])
        stayer = loop.launch("prefix-cache", [prefix, "suffix two", "6"])
        assert (mover.replica.index, stayer.replica.index) == (1, 1)
        stayer.placed = True  # as if it had made a call on replica 1 before importing
        assert loop.run_until(lambda: not mover.alive and not stayer.alive, 120)
        moved, recomputed = (json.loads(messages(loop, inst)[0]) for inst in (mover, stayer))
    assert (mover.replica.index, stayer.replica.index) == (0, 1)
    # Both imports "succeeded" for the inferlet (it did not fall back to a prefix of its own): the stayer's
    # SDK computed the prefix's tokens again on replica 1; both decode what the whole prompt gives.
    tok = Tokenizer(loop.info.tokenizer)
    want = direct_greedy(inference, None, tok.encode(prefix) + tok.encode("suffix two"), 6)
    assert (moved, recomputed) == ({"tokens": want, "forwarded": moved["forwarded"], "imported": True},) * 2


def test_a_killed_replica_ends_only_its_instances_and_comes_back():
    config = InferenceConfig(model="tiny", num_kv_pages=256, num_embeds=64, torch_threads=1)
    supervisors = [InferenceSupervisor(config, name=f"replica {k}") for k in range(2)]
    events = []
    loop = ControlLoop([s.client() for s in supervisors], ControlConfig(program_dir=PROGRAM_DIR, slice_ms=1000),
                       lambda inst, kind, payload: events.append((inst.instance_id, kind, payload)), supervisors)
    loop.events = events
    try:
        loop.programs.add(built("text-completion"), "text-completion")
        args = [[prompt, str(NEW), "--pause", "60000"] for prompt in PROMPTS[:4]]
        paused = [loop.launch("text-completion", a) for a in args]
        assert loop.run_until(lambda: all(inst.io_idle for inst in paused), 120)  # half decoded, waiting
        victim = supervisors[1].process.proc
        os.kill(victim.pid, signal.SIGKILL)
        lost = [inst for inst in paused if inst.replica.index == 1]
        assert loop.run_until(lambda: not any(inst.alive for inst in lost), 30)
        assert {(inst.state, inst.error) for inst in lost} == {
            (State.KILLED, "inference replica 1 died: killed by signal 9")}
        survivors = [inst for inst in paused if inst.replica.index == 0]
        assert len(lost) == len(survivors) == 2 and all(inst.alive for inst in survivors)
        for inst in survivors:
            loop.deliver(inst.instance_id, "the tool's answer")
        assert loop.run_until(lambda: not any(inst.alive for inst in survivors), 60)
        with tiny_inference() as reference:
            want = {a[0]: expected(reference, a[0]) for a in args}
            assert [messages(loop, inst)[-1] for inst in survivors] == [want[inst.args[0]] for inst in survivors]
            assert supervisors[1].process.proc is not victim
            # replica 1 serves again: new runs land on both and decode right
            assert loop.run_until(lambda: loop.replicas[1].serving, 120)  # (new runs avoid it while it loads)
            again = run(loop, "text-completion", [[prompt, str(NEW)] for prompt in PROMPTS[:2]], timeout_s=120)
            assert sorted(inst.replica.index for inst in again) == [0, 1]
            assert [messages(loop, inst)[-1] for inst in again] == [expected(reference, p) for p in PROMPTS[:2]]
    finally:
        loop.close()
        for supervisor in supervisors:
            supervisor.stop()


def test_oven_serve_data_parallel_shows_each_replica(tmp_path):
    srv = Server(tmp_path, "--data-parallel", "2", programs=("hello-python",))
    try:
        assert len(srv.children()) == 2
        env = {**os.environ, "OVEN_TOKEN": srv.operator_token}
        common = ["--server", srv.endpoint, "--token", srv.operator_token]
        for prompt in PROMPTS[:2]:
            done = subprocess.run([*OVEN, "run", *common, "hello-python", "--", prompt, "4"], capture_output=True,
                                  text=True, env=env, timeout=120)
            assert done.returncode == 0, done.stderr
        stats = subprocess.run([*OVEN, "stats", *common], capture_output=True, text=True, env=env, timeout=60)
        assert stats.returncode == 0, stats.stderr
        lines = [line for line in stats.stdout.splitlines() if line.startswith("replica ")]
        assert [line.split(":")[0] for line in lines] == ["replica 0", "replica 1"]
        assert all("serving, 0 instances" in line and " 0 batches" not in line for line in lines)
        ps = subprocess.run([*OVEN, "ps", *common], capture_output=True, text=True, env=env, timeout=60)
        assert sorted(line.split()[6] for line in ps.stdout.splitlines()[1:]) == ["0", "1"]
    finally:
        srv.stop()
