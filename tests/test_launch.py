"""Composition (WIT ``children``): an inferlet launches inferlets, awaits or cancels them, and they die with it.

``inferlets/launch-caller`` (Python SDK) launches ``inferlets/launch-callee`` (Rust SDK) in a real ControlLoop
over a real inference process; both are library programs here, so any client may launch them by name.
"""

from __future__ import annotations

import json
import time

import pytest

from harness import Server, assert_pools_full, built, messages, oven, refused, run

from oven.control.runtime.instance import Instance, InstanceLimits, State
from oven.control.runtime.programs import LIBRARY

PROGRAMS = []  # stored below, in the library
LOOP_CONFIG = dict(max_instances_per_client=3, max_children_per_instance=4)
CANCELLED, PARENT_ENDED = "cancelled by its parent", "its parent ended"


@pytest.fixture(scope="module", autouse=True)
def library(loop):
    for name in ("launch-caller", "launch-callee"):
        wasm = built(name)
        loop.programs.add(wasm, name, namespace=LIBRARY)
        # and the operator's: the tests launch as the operator, whose own names come first, and the shared
        # store may still hold an older build under this name in the operator's namespace
        loop.programs.add(wasm, name)


def direct(loop, prompt: str, max_tokens: int) -> list[str]:
    """What launch-callee sends when a client launches it."""
    (inst,) = run(loop, "launch-callee", [[prompt, str(max_tokens)]])
    assert (inst.state, inst.exit_code) == (State.FINISHED, 0), inst.error
    return messages(loop, inst)


def children_of(loop, inst) -> list:
    """The records of ``inst``'s children, running or ended, in launch order."""
    records = [*loop.finished.values(), *(i.record() for i in loop.instances.values())]
    return sorted((r for r in records if r.parent == inst.instance_id), key=lambda r: int(r.instance_id.split("-")[0], 16))


def reports(loop, inst) -> list[dict]:
    return [json.loads(m) for m in messages(loop, inst)[:-1]]


def test_a_childs_output_reaches_its_caller_exactly(loop):
    expected = [direct(loop, f"The quick brown fox {i}", 8) for i in range(3)]
    assert all(len(e) == 1 and e[0] for e in expected)
    (caller,) = run(loop, "launch-caller", [["3", "The quick brown fox", "8"]])
    assert (caller.state, caller.exit_code) == (State.FINISHED, 0), caller.error
    assert reports(loop, caller) == [{"child": i, "state": "finished", "code": 0, "error": "", "messages": e}
                                     for i, e in enumerate(expected)]
    assert messages(loop, caller)[-1] == "\n".join(e[0] for e in expected)
    children = children_of(loop, caller)
    assert [(r.state, r.exit_code, r.launched_as, r.owner) for r in children] == \
        [(State.FINISHED, 0, "launch-callee", caller.owner)] * 3
    assert [messages(loop, child) for child in children] == expected  # its clients see them too
    assert_pools_full(loop)


def test_cancel_ends_the_child_with_a_clear_state(loop):
    expected = [direct(loop, f"Once upon a time {i}", 5) for i in (0, 2)]
    (caller,) = run(loop, "launch-caller", [["--cancel", "1", "3", "Once upon a time", "5"]])
    assert (caller.state, caller.exit_code) == (State.FINISHED, 0), caller.error
    assert reports(loop, caller) == [
        {"child": 0, "state": "finished", "code": 0, "error": "", "messages": expected[0]},
        {"child": 1, "state": "killed", "code": 143, "error": CANCELLED, "messages": []},
        {"child": 2, "state": "finished", "code": 0, "error": "", "messages": expected[1]},
    ]
    cancelled = children_of(loop, caller)[1]
    assert (cancelled.state, cancelled.exit_code, cancelled.error) == (State.KILLED, 143, CANCELLED)
    assert_pools_full(loop)


@pytest.mark.parametrize("ending", ["killed", "exits", "raises"])
def test_a_caller_that_ends_leaves_no_child_running(loop, ending):
    """However the caller ends (killed by its client, returning, an exception), its children end with it."""
    flags = {"killed": [], "exits": ["--leave", "exit"], "raises": ["--leave", "raise"]}[ending]
    caller = loop.launch("launch-caller", ["--hold", *flags, "2", "Hello", "4"])
    if ending == "killed":  # once both children run (each has sent its text and waits for a message)
        assert loop.run_until(lambda: [len(messages(loop, c)) for c in children_of(loop, caller)] == [1, 1], 120)
        loop.terminate(caller.instance_id, "terminated by a client")
    assert loop.run_until(lambda: not caller.alive, 120)
    expected_state = {"killed": State.KILLED, "exits": State.FINISHED, "raises": State.FAILED}[ending]
    assert caller.state is expected_state
    children = children_of(loop, caller)
    assert len(children) == 2
    assert [(r.state, r.exit_code, r.error) for r in children] == [(State.KILLED, 143, PARENT_ENDED)] * 2
    assert not loop.instances  # no orphan: nothing runs
    assert not any(runner.instance_ids for runner in loop.runners.all())
    assert_pools_full(loop)


def test_the_depth_cap_holds(loop):
    """A launcher that launches itself stops at depth 4 with an error it catches and reports."""
    (root,) = run(loop, "launch-caller", [["--recurse", "0"]])
    assert (root.state, root.exit_code) == (State.FINISHED, 0), root.error
    assert messages(loop, root) == ["4: launch 'launch-caller': its child would be at depth 5, past the server's "
                                    "maximum of 4 (oven serve --max-launch-depth)"]
    chain, inst_id = [], root.instance_id
    while (children := [r for r in loop.finished.values() if r.parent == inst_id]):
        (child,) = children
        chain.append((child.state, child.exit_code))
        inst_id = child.instance_id
    assert chain == [(State.FINISHED, 0)] * 4


def test_the_children_per_instance_cap_holds(loop):
    (caller,) = run(loop, "launch-caller", [["5", "Hi", "1"]])
    assert caller.exit_code == 2
    assert messages(loop, caller)[0] == ("launch 4 failed: launch 'launch-callee': this inferlet holds 4 children, "
                                         "its maximum (oven serve --max-children-per-instance); wait for some first")
    assert [json.loads(m)["state"] for m in messages(loop, caller)[1:-1]] == ["finished"] * 4


def test_the_per_client_cap_holds_and_hurts_only_its_client(loop):
    """alice may run 3 instances: her fan-out and her fork bomb stop there; bob's instance runs as if alone."""
    expected = direct(loop, "Bob's turn", 6)
    fan_out = loop.launch("launch-caller", ["--hold", "5", "Hi", "2"], owner="alice")
    bomb = loop.launch("launch-caller", ["--recurse", "0"], owner="alice")
    bob = loop.launch("launch-callee", ["Bob's turn", "6"], owner="bob")
    assert loop.run_until(lambda: not bomb.alive and not bob.alive, 120)
    assert (bob.state, messages(loop, bob)) == (State.FINISHED, expected)
    # Whichever of alice's launchers got there first, together they never ran more than 3 instances.
    refusal = "this client runs 3 instances, its maximum (oven serve --max-instances-per-client)"
    assert refusal in messages(loop, bomb)[0]
    assert loop.run_until(lambda: any(refusal in m for m in messages(loop, fan_out)), 120)
    assert loop.num_instances("alice") <= 3
    loop.terminate(fan_out.instance_id, "done")
    assert loop.run_until(lambda: not loop.instances, 60)
    assert_pools_full(loop)


def test_a_forged_or_foreign_child_handle_is_an_error(loop):
    holder = loop.launch("launch-caller", ["--hold", "1", "Hi", "1"])  # holds child 1
    assert loop.run_until(lambda: len(children_of(loop, holder)) == 1, 60)
    (forger,) = run(loop, "launch-caller", [["--forge", "1"]])
    not_held = "child 1 is not held by this inferlet (never launched here, or its exit already taken)"
    assert messages(loop, forger) == [f"cancel: cancel-child: {not_held}", f"wait: wait-child: {not_held}"]
    assert forger.exit_code == 0
    (child,) = children_of(loop, holder)
    assert child.state in (State.READY, State.WAITING)  # the holder's child is untouched
    loop.terminate(holder.instance_id, "done")
    assert loop.run_until(lambda: not loop.instances, 60)
    assert_pools_full(loop)


@pytest.mark.parametrize("args, error", [
    ([], "give N PROMPT K, or --recurse D, or --forge H"),
    (["1", "Hi"], "give N PROMPT K, or --recurse D, or --forge H"),
    (["--recurse", "0", "1", "Hi", "2"], "--recurse and --forge take no N PROMPT K"),
    (["--recurse", "0", "--forge", "1"], "argument --forge: not allowed with argument --recurse"),
    (["--leave", "stay", "1", "Hi", "2"], "argument --leave: invalid choice: 'stay' (choose from exit, raise)"),
    (["1", "Hi", "x"], "argument K: expected a whole number >= 0, not 'x'"),
])
def test_bad_arguments_are_refused(loop, args, error):
    (stderr,) = refused(loop, "launch-caller", [args])
    assert stderr.startswith("usage: launch-caller [-h] [--recurse D | --forge H]")
    assert stderr.endswith(f"launch-caller: error: {error}\n")


def test_oven_ps_shows_a_childs_parent(tmp_path):
    """Through a real `oven serve`: `ps --json` gives each instance's parent, and `ps` a PARENT column."""
    srv = Server(tmp_path, programs=("launch-caller",))
    try:
        token = tmp_path / "operator.token"
        token.write_text(srv.operator_token)
        ps = ["ps", "--server", srv.endpoint, "--token", f"@{token}"]
        with srv.client() as client:
            assert "PARENT" not in oven(*ps).stdout.splitlines()[0]  # no child: no column
            for name in ("launch-caller", "launch-callee"):
                client.upload(built(name), name)
            caller = client.launch("launch-caller", ["--hold", "1", "Hi", "2"], detach=True)
            deadline = time.monotonic() + 120
            while not (children := [i for i in client.instances() if i.parent == caller]):
                assert time.monotonic() < deadline, "the child never showed"
                time.sleep(0.1)
            (child,) = children
            listing = json.loads(oven(*ps, "--json").stdout)["instances"]
            assert {i["instance_id"]: i["parent"] for i in listing} == {caller: "", child.instance_id: caller}
            table = [line.split() for line in oven(*ps).stdout.splitlines()]
            assert table[0][:5] == ["INSTANCE", "PROGRAM", "OWNER", "PARENT", "STATE"]
            rows = {row[0]: row for row in table[1:]}
            assert rows[caller][1:4] == ["launch-caller", "operator", "-"]
            assert rows[child.instance_id][1:4] == ["launch-callee", "operator", caller]
            client.terminate(caller)
    finally:
        srv.stop()


def test_a_childs_messages_kept_for_its_parent_are_bounded():
    """Within its inbox's bounds (inbox_messages, inbox_mib): past them its send fails it, naming why."""
    limits = InstanceLimits(inbox_messages=2, inbox_bytes=1 << 20)
    parent, child = (Instance(f"{i}-cafe", "p" * 64, [], "alice", limits) for i in (1, 2))
    child.parent = parent
    child.keep_for_parent("a")
    child.keep_for_parent("b")
    with pytest.raises(ValueError, match=r"^send: its parent holds 2 messages of this child already, at most 2 and "
                                         r"1 MiB$"):
        child.keep_for_parent("c")
    parent.keep_for_parent("no parent: kept for no one")
    assert (child.messages_for_parent, parent.messages_for_parent) == (["a", "b"], [])
