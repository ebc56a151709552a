"""The client library (oven.client.rpc) against a real ``oven serve`` (tiny model): launch by library and
uploaded name as ``oven run`` resolves them, run() to an instance's exit, one instance's events ending at
its exit, and docs/client.md's example, executed as written. One server for the module."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from harness import Server

from oven.client.programs import library_program
from oven.client.rpc import ControlRequestError, InstanceTimeout, OvenClient, ProgramNotFound

PROMPT, NUM_TOKENS = "Once upon a time", "8"
DOC = Path(__file__).resolve().parents[1] / "docs" / "client.md"
TESTED_BLOCK = re.compile(r"<!-- tested -->\s*```python\n(.*?)```", re.S)


def wasm(name: str) -> bytes:
    """The library inferlet's component, as ``oven run NAME`` finds it."""
    return library_program(name).path.read_bytes()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A server with a program store of its own (no client has a name or a right there from an earlier
    run), seeded with the compiled code of the inferlets used here."""
    root = tmp_path_factory.mktemp("client-library")
    server = Server(root, programs=("text-completion", "echo"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def env(server) -> dict[str, str]:
    """What a user sets to reach this server without naming it in code."""
    return {"OVEN_CONTROL_ENDPOINT": server.endpoint, "OVEN_TOKEN": f"@{server.state / 'operator.token'}"}


@pytest.fixture(scope="module")
def cli_completion(server, env) -> tuple[str, str]:
    """What ``oven run text-completion`` shows on this server: the completion the instance printed, and the
    message it sent (the token ids; the CLI prints it on a line of its own). The library must get the same."""
    done = subprocess.run([sys.executable, "-m", "oven.client.cli", "run", "text-completion", "--", PROMPT,
                           NUM_TOKENS], env={**os.environ, **env}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    printed, ids = done.stdout.removesuffix("\n").rsplit("\n", 1)
    return printed + "\n", ids


@pytest.fixture(scope="module")
def token(server) -> str:
    """A client of its own (not the operator): it starts with no program names on the server."""
    with server.client() as operator:
        return operator.add_client("library-user")


@pytest.fixture
def client(server, token):
    with server.client(token) as client:
        yield client


def test_launch_by_library_name_uploads_the_built_inferlet(client, cli_completion):
    digest = hashlib.sha256(wasm("text-completion")).hexdigest()
    assert digest not in [p.sha256 for p in client.programs()]  # the name means nothing to the server yet
    told = []
    instance_id = client.launch("text-completion", [PROMPT, NUM_TOKENS], on_upload=lambda *a: told.append(a))
    assert instance_id.endswith(digest[:8])
    assert told == [("text-completion", len(wasm("text-completion")))]
    result = client.wait(instance_id)
    assert (result.state, result.exit_code, result.error) == ("finished", 0, "")
    assert (result.stdout, *result.messages) == cli_completion
    assert len(result.messages[0].split()) == int(NUM_TOKENS)
    assert [p.names for p in client.programs() if p.sha256 == digest] == [["text-completion"]]
    client.wait(client.launch("text-completion", [PROMPT, "1"], on_upload=lambda *a: told.append(a)))
    assert len(told) == 1  # held now: no second notice


def test_launch_by_uploaded_name_and_what_resolves_to_nothing(client, tmp_path):
    client.upload(wasm("echo"), "library-test-echo")
    echo = client.launch("library-test-echo")
    client.send(echo, "bye")
    assert client.wait(echo).messages == ["echo: bye"]
    with pytest.raises(ControlRequestError, match="unknown_program: no program named or hashed 'no-such-inferlet'"):
        client.launch("no-such-inferlet")
    with pytest.raises(ProgramNotFound, match=f"^{tmp_path}/missing.wasm: no such file$"):
        client.launch(str(tmp_path / "missing.wasm"))
    told = []
    (tmp_path / "fresh.wasm").write_bytes(b"\0asm\x01\0\0\0")  # a core module, not a component
    with pytest.raises(ControlRequestError, match="bad_program"):
        client.launch(str(tmp_path / "fresh.wasm"), on_upload=lambda *a: told.append(a))
    assert told == [("fresh", 8)]  # told before the upload, as `oven run` says it


def test_run_returns_at_exit_with_output_and_state(client, cli_completion):
    seen = []
    done = client.run("text-completion", [PROMPT, NUM_TOKENS], on_event=seen.append)
    assert (done.state, done.exit_code, done.error, done.ok) == ("finished", 0, "", True)
    assert (done.stdout, *done.messages) == cli_completion
    assert [e.kind for e in seen][-2:] == ["message", "exit"]
    assert "".join(e.text for e in seen if e.kind == "stdout") == done.stdout

    failed = client.run("text-completion", ["", NUM_TOKENS])  # nothing to decode: an exception ends it
    assert (failed.state, failed.exit_code, failed.ok) == ("failed", 1, False)
    assert failed.error == "ValueError: the context is empty: fill it before decoding"
    assert failed.stdout == "" and failed.messages == []
    assert failed.stderr.endswith("ValueError: the context is empty: fill it before decoding\n")

    usage = client.run("text-completion", [PROMPT, "--temperature", "hot"])  # a usage error: it ends with status 2
    assert (usage.state, usage.exit_code, usage.error, usage.ok) == ("finished", 2, "", False)
    assert usage.stderr.startswith("usage: text-completion [-h]")
    assert usage.stderr.endswith("text-completion: error: argument --temperature: expected a number >= 0, not 'hot'\n")


def test_instance_events_end_at_exit_and_leave_others_events(client):
    first, second = client.launch("echo"), client.launch("echo")
    client.send(second, "to the second")
    client.send(first, "bye")
    assert [(e.kind, e.text, e.exit_code) for e in client.instance_events(first, timeout_s=60)] == [
        ("message", "echo: bye", None), ("exit", "", 0)]
    client.send(second, "bye")
    assert [(e.kind, e.text) for e in client.instance_events(second, timeout_s=60)] == [
        ("message", "echo: to the second"), ("message", "echo: bye"), ("exit", "")]
    # An ended instance's events again: the client attaches and the server replays them.
    assert [e.kind for e in client.instance_events(first)] == ["message", "exit"]


def test_a_timeout_leaves_a_followed_instance_and_ends_a_run(client):
    echo = client.launch("echo")
    with pytest.raises(InstanceTimeout, match=f"instance {echo} did not exit within 0.5 s"):
        list(client.instance_events(echo, timeout_s=0.5))
    assert [i.state for i in client.instances() if i.instance_id == echo] == ["waiting"]
    client.terminate(echo)
    ended = client.wait(echo)
    assert (ended.state, ended.exit_code, ended.error) == ("killed", 143, "terminated by a client")

    before = {i.instance_id for i in client.instances()}
    with pytest.raises(InstanceTimeout, match="did not exit within 0.5 s"):
        client.run("echo", timeout_s=0.5)
    (runaway,) = [i for i in client.instances() if i.instance_id not in before]
    assert (runaway.state, runaway.exit_code, runaway.error) == ("killed", 143, "terminated by a client")


def test_the_documented_example_runs(server, env, cli_completion, monkeypatch):
    blocks = TESTED_BLOCK.findall(DOC.read_text())
    assert len(blocks) == 1
    for name, value in env.items():  # the example finds the server as a user's script would
        monkeypatch.setenv(name, value)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(blocks[0], str(DOC), "exec"), {})
    completion, ids = cli_completion
    assert printed.getvalue() == (f"finished 0\n{completion}token ids: {ids}\necho: hello\n"
                                  "exit 143 terminated by a client\n")


def test_every_public_method_has_a_docstring_and_a_row_in_the_reference():
    reference = DOC.read_text().split("## Reference", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"`([a-z_]+)\(", reference))
    public = {name for name, member in vars(OvenClient).items() if callable(member) and not name.startswith("_")}
    assert public - documented == set()
    assert documented - public == set()
    assert [name for name in sorted(public) if not (getattr(OvenClient, name).__doc__ or "").strip()] == []
