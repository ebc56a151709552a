"""`oven serve` and the client verbs, as real processes over ZeroMQ (tiny model)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import msgpack
import pytest
import zmq

from harness import seed_store

from oven.client.programs import library_program
from oven.client.rpc import ControlRequestError, OvenClient, find_token
from oven.client.generate import greedy_generate
from oven.proto.endpoints import private_endpoint
from oven.control.tokenizer import Tokenizer
from oven.proto import control as c
from oven.proto.auth import default_state_dir, secure_client

LEASE_S = 2.0
# The Python inferlets its tests upload, but hello-python: the first upload of that one is compiled and said.
SEEDED = ("echo", "hostile", "prefix-cache")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    control = private_endpoint()
    cmd = [sys.executable, "-m", "oven.client.cli", "serve", "--model", "tiny", "--quiet",
           "--control-endpoint", control, "--num-kv-pages", "128",
           "--program-dir", str(seed_store(tmp_path_factory.mktemp("programs"), *SEEDED)), "--lease-s", str(LEASE_S)]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 120
    # The server writes this user's operator token into the default state directory when it starts; on a
    # fresh machine, a client made before then has no token to connect with.
    while not (default_state_dir() / "operator.token").exists():
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, "oven serve wrote no operator token"
        time.sleep(0.2)
    with OvenClient(control) as client:
        while not client.reachable(timeout_s=1.0):
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "oven serve did not come up"
    yield control, proc
    proc.terminate()
    assert proc.wait(30) == 0


OVEN = [sys.executable, "-m", "oven.client.cli"]


def oven(*args: str, timeout_s: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([*OVEN, *args], capture_output=True, text=True, timeout=timeout_s, env=os.environ.copy())


def upload(client: OvenClient, name: str) -> str:
    program = library_program(name)
    return client.upload_file(program.path, program.name)


def oven_beside(client: OvenClient, seen: list[c.InstanceEvent], *args: str) -> subprocess.CompletedProcess:
    """``oven(*args)`` while ``client`` keeps its lease (on a loaded machine a verb can take longer
    than LEASE_S); the events it is pushed meanwhile go to ``seen``. For verbs that print little."""
    proc = subprocess.Popen([*OVEN, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=os.environ.copy())
    deadline = time.monotonic() + 180
    for event in client.events(poll_s=0.1):
        if event is not None:
            seen.append(event)
        if proc.poll() is not None:
            return subprocess.CompletedProcess(proc.args, proc.returncode, *proc.communicate())
        assert time.monotonic() < deadline, f"oven {args[0]} did not finish"


def next_event(client: OvenClient, seen: list[c.InstanceEvent], kind: str, timeout_s: float = 120) -> c.InstanceEvent:
    """The next pushed event of ``kind``, first taken from ``seen`` (the events before it are dropped
    from there too); fails if none comes in time."""
    while seen:
        if (event := seen.pop(0)).kind == kind:
            return event
    deadline = time.monotonic() + timeout_s
    for event in client.events():
        if event is not None and event.kind == kind:
            return event
        assert time.monotonic() < deadline, f"no {kind} event in {timeout_s} s"


def raw_peer(control: str) -> zmq.Socket:
    """A bare DEALER speaking the control protocol under this user's token: it sends and reads exactly
    the frames a test says (OvenClient reads replies and events for its caller)."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    secure_client(sock, find_token())
    sock.connect(control)
    return sock


def direct_greedy(inference, prompt: str, max_new: int) -> list[int]:
    """Greedy tokens from a separate inference process on the same (seeded) tiny model: the server's
    own admits its control process alone."""
    with inference.client() as client:
        info = client.info()
        tok = Tokenizer(info.tokenizer)
        return greedy_generate(client, tok.encode(prompt), max_new, tok.stop_token_ids, info.page_size,
                               info.num_kv_pages).token_ids


@pytest.mark.parametrize("program", ["hello-python", "hello-rust"])
def test_oven_run_prints_the_greedy_tokens(server, inference, program):
    control, _ = server
    done = oven("run", "--server", control, program, "--", "Once upon a time", "8")
    assert done.returncode == 0, done.stderr
    expected = " ".join(map(str, direct_greedy(inference, "Once upon a time", 8)))
    assert done.stdout.strip().splitlines()[-1] == expected
    # the first upload says how long the server's compile takes: seconds for Python, not for Rust
    took = {"hello-python": "about 15 s for a Python inferlet", "hello-rust": "a second or so"}[program]
    assert done.stderr == f"oven: uploading {program}; the server compiles it once ({took}) ...\n"


def test_oven_run_exits_with_the_inferlet_status(server):
    control, _ = server
    done = oven("run", "--server", control, "hostile", "--", "trap")
    assert done.returncode == 1
    assert "RuntimeError: hostile inferlet gave up" in done.stderr
    done = oven("run", "--server", control, "hostile", "--", "forged")
    assert done.returncode == 3 and done.stdout.startswith("error: ")


def test_ps_send_and_kill(server):
    control, _ = server
    started = oven("run", "--server", control, "--detach", "echo")
    assert started.returncode == 0, started.stderr
    instance_id = started.stdout.strip()
    with OvenClient(control) as client:
        client.attach(instance_id)
        seen = []
        assert oven_beside(client, seen, "send", "--server", control, instance_id, "hello").returncode == 0
        event = next_event(client, seen, "message")
        assert event.text == "echo: hello"
        listing = oven_beside(client, seen, "ps", "--server", control).stdout
        assert instance_id in listing and "waiting" in listing
        assert oven_beside(client, seen, "kill", "--server", control, instance_id).returncode == 0
        event = next_event(client, seen, "exit")
        assert event.exit_code == 143
    assert "unknown_instance" in oven("kill", "--server", control, instance_id).stderr


@pytest.mark.parametrize("payload, request_id, code", [
    (b"\xc1", 0, "malformed"),
    (msgpack.packb([c.CONTROL_PROTOCOL_VERSION, "launch", 4, ["x"]]), 4, "malformed"),
    (c.CODEC.encode(c.Ok(), 4), 4, "not_a_request"),
])
def test_malformed_client_messages_get_errors(server, payload, request_id, code):
    control, _ = server
    peer = raw_peer(control)
    peer.send(payload)
    assert peer.poll(10000)
    envelope = c.CODEC.decode(peer.recv())
    assert (envelope.request_id, type(envelope.message), envelope.message.code) == (request_id, c.ControlError, code)
    peer.close(0)


def test_bad_requests_get_errors_and_the_server_goes_on(server):
    control, _ = server
    with OvenClient(control) as client:
        with pytest.raises(ControlRequestError, match="unknown_program"):
            client.launch("no-such-program", [])
        with pytest.raises(ControlRequestError, match="bad_upload"):
            client.request(c.UploadChunk("x", "0" * 64, 10, 5, b"abc"))
        assert client.info().models == ["tiny"]


def test_a_slow_client_loses_nothing(server):
    """A client that reads nothing for a while, while its instance floods it: every line, message,
    reply and the exit come through, in order, and meanwhile the instance is held, not run ahead."""
    control, _ = server
    n = 3000  # 6001 frames: more than ZeroMQ's pipes hold (1000 each way), which used to drop the rest
    with OvenClient(control) as probe:
        program = upload(probe, "hostile")
        client = raw_peer(control)  # launches, so it is the instance's watcher
        client.send(c.CODEC.encode(c.Launch(program, ["flood", str(n)]), 1))
        assert client.poll(10000)
        instance_id = c.CODEC.decode(client.recv()).message.instance_id
        deadline = time.monotonic() + 120
        state = "ready"
        while state != "held":  # read nothing; heartbeats (replies unread) keep the lease
            client.send(c.CODEC.encode(c.Heartbeat(), 1000))
            assert time.monotonic() < deadline and state in ("ready", "waiting"), state
            time.sleep(0.2)
            state = next(i.state for i in probe.instances() if i.instance_id == instance_id)
        time.sleep(LEASE_S / 2)
        assert next(i.state for i in probe.instances() if i.instance_id == instance_id) == "held"
        messages, lines, heartbeats, beat = [], "", 0, time.monotonic()
        while True:  # now read everything (replies to the heartbeats among it), keeping the lease
            if time.monotonic() - beat > LEASE_S / 4:
                client.send(c.CODEC.encode(c.Heartbeat(), 1000))
                beat = time.monotonic()
            assert client.poll(30_000), f"stalled after {len(messages)} messages"
            message = c.CODEC.decode(client.recv()).message
            heartbeats += isinstance(message, c.Alive)
            if isinstance(message, c.InstanceEvent) and message.kind == "message":
                messages.append(message.text)
            elif isinstance(message, c.InstanceEvent) and message.kind == "stdout":
                lines += message.text
            elif isinstance(message, c.InstanceEvent) and message.kind == "exit":
                assert message.exit_code == 0
                break
        assert messages == [f"m{i}" for i in range(n)]
        assert lines.splitlines() == [f"line {i}" for i in range(n)]
        assert heartbeats > 0
        client.send(c.CODEC.encode(c.ServerInfo(), 2))  # requests after all that still get replies
        assert client.poll(10000) and c.CODEC.decode(client.recv()).message.models == ["tiny"]
        client.close(0)


def test_exports_are_listed_and_dropped(server):
    """A finished exporter's export outlives it; `oven exports` shows it and `--drop` gives its pages back."""
    control, _ = server
    with OvenClient(control) as client:
        full = client.stats().free_kv_pages
    done = oven("run", "--server", control, "prefix-cache", "--", "A system prompt worth caching. " * 4, "Hi", "2")
    assert done.returncode == 0, done.stderr
    with OvenClient(control) as client:
        (entry,) = client.exports()
        assert entry.name.startswith("prefix-cache/") and entry.num_pages > 0 and not entry.exporter_running
        assert client.stats().free_kv_pages == full - entry.num_pages
    listing = oven("exports", "--server", control)
    assert listing.returncode == 0 and listing.stdout.splitlines()[1].split() == [
        entry.name, str(entry.num_pages), entry.exporter, "operator", "ended"]
    dropped = oven("exports", "--server", control, "--drop", entry.name)
    assert dropped.returncode == 0 and dropped.stdout.strip() == f"dropped {entry.name}"
    with OvenClient(control) as client:
        assert client.exports() == [] and client.stats().free_kv_pages == full
    again = oven("exports", "--server", control, "--drop", entry.name)
    assert again.returncode == 1 and f"unknown_export: no kvpage export named {entry.name!r}" in again.stderr
