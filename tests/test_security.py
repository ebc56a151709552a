"""oven as a shared service: each exploit found by probing `oven serve` as another client, another
local user, or by killing its processes, turned into a test (issue 12). Real `oven serve` processes
over ZeroMQ with CurveZMQ, two client identities, the tiny model."""

from __future__ import annotations

import errno
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import wasmtime
import zmq

from oven.client.connect import TOKEN_IN_ARGV
from oven.client.generate import greedy_generate
from oven.client.rpc import ControlRequestError, OvenClient, ServerRestarted
from oven.control.adapter_store import FILES as ADAPTER_FILES, AdapterStore
from oven.control.keyring import Keyring
from oven.control.runtime import programs as programs_module
from oven.control.runtime.programs import ProgramError, ProgramStore, engine_config
from oven.control.tokenizer import Tokenizer
from oven.proto import control as c
from oven.proto.auth import AuthError, Keypair, Token, private_dir
from oven.proto import endpoints
from oven.proto.endpoints import private_endpoint

from harness import OVEN, Server, built, oven, wait_exit

@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp("shared"), "--max-instances-per-client", "2", "--inbox-messages", "8",
                 programs=("echo", "hostile", "prefix-cache"))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def alice(server):
    with server.client() as operator:
        return operator.add_client("alice")


@pytest.fixture(scope="module")
def bob(server):
    with server.client() as operator:
        return operator.add_client("bob")


# -- the program store: names are never paths; only code the store compiled is loaded ------------------
# Two programs for the store's rules: Rust ones, compiled in well under a second (a Python one takes
# about 10 s and 55 MB).
MINE, OTHER = "hello-rust", "text-completion-rust"


@pytest.fixture
def store(tmp_path):
    return ProgramStore(tmp_path / "programs", wasmtime.Engine(engine_config()))


@pytest.mark.parametrize("ref", ["/tmp/planted/x", "../../../tmp/planted/hello-rust", "a/b", ".hidden", "",
                                 "x" * 65, "echo\x00"])
def test_a_program_name_is_never_a_path(store, ref):
    with pytest.raises(ProgramError, match="not a program name or a SHA-256|no program named"):
        store.resolve(ref, "alice")


def test_only_code_the_store_compiled_is_loaded(store, tmp_path, caplog):
    """A .cwasm planted in the store (another program's code, or junk filled with int3) is never
    deserialized: its HMAC does not check, so the program is compiled again from its .wasm."""
    digest = store.add(built(MINE), "mine")
    other = store.add(built(OTHER), "other")
    # The files as an attacker finds them in the store.
    (compiled,), (others,) = (list(store.root.glob(f"{d}.*.cwasm")) for d in (digest, other))
    for planted in (others.read_bytes(), b"\xcc" * 65536):
        compiled.write_bytes(planted)
        fresh = ProgramStore(store.root, store.engine)  # a restarted server: nothing in memory
        with caplog.at_level("WARNING"):
            fresh.component(digest)
        assert "its HMAC does not check" in caplog.text
        assert compiled.read_bytes() != planted  # replaced by what this store compiled
        caplog.clear()
    assert (store.root.stat().st_mode & 0o777) == 0o700 and ((store.root / "code.key").stat().st_mode & 0o777) == 0o600


def test_a_rejected_upload_leaves_nothing(store):
    before = sorted(p.name for p in store.root.iterdir())
    core_module = b"\x00asm\x01\x00\x00\x00"  # a valid, empty core module: not a component
    for junk, reason in ((b"not wasm at all", "bad magic number"), (core_module, "not a valid component"),
                         (b"\x00asm" + os.urandom(1 << 20), "not a valid component")):
        for _ in range(2):  # the same bytes again fail the same way: nothing half-stored says "known"
            with pytest.raises(ProgramError, match=reason):
                store.add(junk, "junk")
    assert sorted(p.name for p in store.root.iterdir()) == before
    assert store.entries() == []


def test_names_belong_to_their_client(store):
    mine = store.add(built(MINE), "echo", uploader="alice")
    other = store.add(built(OTHER), "echo", uploader="mallory")  # mallory's own "echo"
    assert store.resolve("echo", "alice") == mine and store.resolve("echo", "mallory") == other
    with pytest.raises(ProgramError, match="no program named or hashed 'echo'"):
        store.resolve("echo", "bob")
    with pytest.raises(ProgramError, match="no program named or hashed"):
        store.resolve(mine, "bob")  # a digest bob never uploaded
    store.add(built(MINE), "echo", namespace="")  # the operator publishes it in the library
    assert store.resolve("echo", "bob") == mine and store.resolve("echo", "mallory") == other
    restarted = ProgramStore(store.root, store.engine)  # names persist per client
    assert restarted.resolve("echo", "alice") == mine and restarted.resolve("echo", "mallory") == other


def test_a_client_has_at_most_max_names_and_a_removed_one_none(store, monkeypatch):
    """Each name rewrites names.json, so a client's are bounded; the bound is checked before the bytes
    are compiled or stored. A removed client's names and uploads are forgotten, its programs kept."""
    monkeypatch.setattr(programs_module, "MAX_NAMES_PER_CLIENT", 2)
    mine = store.add(built(MINE), "one", uploader="mallory")
    store.add(built(MINE), "two", uploader="mallory")
    store.add(built(MINE), "two", uploader="mallory")  # a name it has already: no new one
    with pytest.raises(ProgramError, match="2 program names are taken in 'mallory' already"):
        store.check_name_room("mallory", "three")
    with pytest.raises(ProgramError, match="2 program names are taken in 'mallory' already"):
        store.add(built(OTHER), "three", uploader="mallory")
    assert len(store.entries()) == 1  # refused before it was compiled and stored
    store.add(built(MINE), "three", uploader="alice")  # another client's names are its own
    store.forget_client("mallory")
    with pytest.raises(ProgramError, match="no program named or hashed"):
        store.resolve(mine, "mallory")
    assert store.resolve("three", "alice") == mine and store.has(mine)


def test_a_client_removes_what_it_stored_and_no_more(store):
    """Removing forgets the caller's names and upload; the files go with the last client that has the
    program. The operator's removal takes it from everyone, the library included."""
    mine = store.add(built(MINE), "mine", uploader="alice")
    store.add(built(MINE), "also-mine", uploader="bob")
    assert store.remove(mine, "alice") is False  # bob still has it
    with pytest.raises(ProgramError, match="no program named or hashed 'mine'"):
        store.resolve("mine", "alice")
    assert store.resolve("also-mine", "bob") == mine and not store.holds(mine, "alice")
    assert store.remove(mine, "bob") is True and not store.has(mine)
    assert list(store.root.glob(f"{mine}*")) == []  # the .wasm and the compiled code
    other = store.add(built(OTHER), "tool", uploader="carol")
    store.add(built(OTHER), "tool", namespace="")  # the operator publishes it
    assert store.remove(other, "operator") is True and not store.has(other)


def test_a_client_stores_at_most_its_quota(store, monkeypatch):
    monkeypatch.setattr(programs_module, "MAX_PROGRAMS_PER_CLIENT", 1)
    mine = store.add(built(MINE), uploader="mallory")
    with pytest.raises(ProgramError, match=r"this client stores 1 programs \(.* MiB; at most 1 and"):
        store.check_room_for("mallory", 100)
    store.check_room_for("alice", 100)
    store.check_room_for("operator", 100)  # exempt
    store.remove(mine, "mallory")
    store.check_room_for("mallory", 100)
    monkeypatch.setattr(programs_module, "MAX_STORED_BYTES_PER_CLIENT", 99)
    with pytest.raises(ProgramError, match="remove some first"):
        store.check_room_for("mallory", 100)


def test_removing_a_program_over_the_wire(server, alice, bob):
    with server.client(alice) as a, server.client(bob) as b:
        digest = a.upload(built(MINE), "to-remove")  # not a seeded one: removing it deletes its files
        with pytest.raises(ControlRequestError, match="unknown_program: no program named or hashed 'to-remove'"):
            b.request(c.RemoveProgram("to-remove"))  # alice's name means nothing to bob
        a.request(c.RemoveProgram("to-remove"))
        with pytest.raises(ControlRequestError, match="unknown_program: no program named or hashed 'to-remove'"):
            a.launch("to-remove", [])
        assert digest not in [p.sha256 for p in a.programs()]


# -- authentication -------------------------------------------------------------------------------------

def test_a_client_without_a_known_key_gets_nothing(server, tmp_path):
    plain = zmq.Context.instance().socket(zmq.DEALER)  # no CURVE at all: the handshake cannot even start
    plain.setsockopt(zmq.LINGER, 0)
    plain.connect(server.endpoint)
    plain.send(c.CODEC.encode(c.Launch("echo", []), 1))
    assert not plain.poll(1000)
    plain.close()
    stranger = Token(Token.parse(server.operator_token).server_public, Keypair.generate())
    with OvenClient(server.endpoint, token=stranger) as client:
        with pytest.raises(AuthError, match="refused this client's token"):
            client.info(timeout_s=10)
    forged = Token(Keypair.generate().public, Token.parse(server.operator_token).client)
    with OvenClient(server.endpoint, token=forged) as client:  # the right key, sent to the wrong server
        with pytest.raises(AuthError, match="not the server this token was made for"):
            client.info(timeout_s=10)
    token_file = tmp_path / "stranger.token"
    token_file.write_text(str(stranger))
    done = oven("ps", "--server", server.endpoint, "--token", f"@{token_file}")
    assert done.returncode == 1 and done.stderr.strip() == (
        f"oven: the server at {server.endpoint} refused this client's token")


def test_only_the_operator_manages_clients(server, alice):
    with server.client(alice) as client:
        assert client.info().client == "alice"
        with pytest.raises(ControlRequestError, match="forbidden: only the operator may manage clients"):
            client.add_client("eve")
    with server.client() as operator:
        assert {"alice", "operator"} <= set(operator.clients())
        with pytest.raises(ControlRequestError, match="bad_client: a client named 'alice' exists"):
            operator.add_client("alice")
        with pytest.raises(ControlRequestError, match="bad_client: a client name is"):
            operator.add_client("../x")
        token = operator.add_client("carol")
        operator.remove_client("carol")
    with OvenClient(server.endpoint, token=token) as client, pytest.raises(AuthError, match="refused"):
        client.info(timeout_s=10)


def test_the_state_directory_is_private(server):
    assert (server.state.stat().st_mode & 0o777) == 0o700
    for name in ("server.key", "clients.json", "operator.token"):
        assert ((server.state / name).stat().st_mode & 0o777) == 0o600


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv to act as a "
                                                                                "second, unprivileged local user")
def test_another_local_user_reaches_neither_socket_nor_token(server):
    probe = ("import socket, sys\n"
             "for path in sys.argv[1:]:\n"
             "    try:\n"
             "        open(path).read() if path.endswith('.token') else socket.socket(socket.AF_UNIX).connect(path)\n"
             "        print('reached', path)\n"
             "    except OSError as exc:\n"
             "        print(type(exc).__name__)\n")
    done = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", "/usr/bin/python3",
                           "-c", probe, server.endpoint.removeprefix("ipc://"), str(server.state / "operator.token")],
                          capture_output=True, text=True, timeout=30)
    assert done.stdout.split() == ["PermissionError", "PermissionError"], done.stderr


# -- ownership --------------------------------------------------------------------------------------------

def test_a_removed_client_loses_its_connections_and_everything_it_held(server):
    """A connection keeps the name its handshake gave it: once the client is removed, that open
    connection is refused too, its detached instance and exports are gone, and a client given the
    same name later starts with nothing of the first one's."""
    with server.client() as operator:
        token = operator.add_client("eve")
    with server.client(token) as eve, server.client() as operator:
        echo = eve.upload(built("echo"), "eves-echo")
        instance_id = eve.launch(echo, [], detach=True)
        operator.remove_client("eve")
        with pytest.raises(ControlRequestError, match="forbidden: client 'eve' was removed: its token no longer"):
            eve.instances()
        assert instance_id not in [i.instance_id for i in operator.instances()]  # killed, and its record gone
        with server.client(operator.add_client("eve")) as new_eve:
            assert new_eve.instances() == [] and new_eve.exports() == [] and new_eve.programs() == []
            with pytest.raises(ControlRequestError, match="unknown_program: no program named or hashed 'eves-echo'"):
                new_eve.launch("eves-echo", [])
            with pytest.raises(ControlRequestError, match="unknown_program"):
                new_eve.launch(echo, [])  # the first eve uploaded it, not this one
        operator.remove_client("eve")


def test_one_client_cannot_touch_another_clients_instances(server, alice, bob):
    with server.client(alice) as a, server.client(bob) as b, server.client() as operator:
        echo = a.upload(built("echo"), "echo")
        instance_id = a.launch(echo, [], detach=True)
        for act in (lambda: b.attach(instance_id), lambda: b.send(instance_id, "hi"),
                    lambda: b.terminate(instance_id)):
            with pytest.raises(ControlRequestError, match=f"forbidden: instance {instance_id} belongs to another"):
                act()
        assert instance_id not in [i.instance_id for i in b.instances()]
        assert [i.owner for i in a.instances() if i.instance_id == instance_id] == ["alice"]
        with pytest.raises(ControlRequestError, match="unknown_program: no program named or hashed 'echo'"):
            b.request(c.Launch("echo", []))  # alice's name means nothing to bob (launch() would upload the library's)
        digest = b.upload(built("hostile"), "echo")  # bob's own "echo" ...
        a.attach(instance_id)
        a.send(instance_id, "still mine?")  # ... leaves alice's untouched
        event = next(e for e in a.events() if e is not None and e.kind == "message")
        assert event.text == "echo: still mine?"
        assert a.launch("echo", [], detach=True).endswith(echo[:8])
        assert [p.sha256 for p in a.programs()] == [echo] and digest != echo
        operator.terminate(instance_id)  # the operator may
        assert wait_exit(a, instance_id).exit_code == 143
        for i in a.instances():
            if i.state in ("ready", "waiting"):
                a.terminate(i.instance_id)


def test_exports_are_per_client(server, alice, bob):
    """bob's prefix-cache does not find alice's cached prefix (her KV holds her prompt): it builds its own."""
    prefix = "A confidential system prompt worth caching. " * 4
    for token in (alice, bob):
        done = oven("run", "--server", server.endpoint, "--token", token, "prefix-cache", "--", prefix, "Hi", "2")
        assert done.returncode == 0, done.stderr
    with server.client(alice) as a, server.client(bob) as b, server.client() as operator:
        (mine,), (his,) = a.exports(), b.exports()
        assert (mine.name, mine.owner, his.owner) == (his.name, "alice", "bob")
        with pytest.raises(ControlRequestError, match="forbidden: export .* of 'alice' belongs to another client"):
            b.drop_export(mine.name, owner="alice")
        b.drop_export(his.name)
        assert b.exports() == [] and [e.owner for e in operator.exports()] == ["alice"]
        operator.drop_export(mine.name, owner="alice")
        assert a.exports() == []


def test_per_client_caps(server, bob):
    """--max-instances-per-client 2 and --inbox-messages 8 (the server fixture's)."""
    with server.client(bob) as b:
        program = b.upload(built("hostile"))
        deaf = [b.launch(program, ["deaf"], detach=True) for _ in range(2)]
        with pytest.raises(ControlRequestError, match="too_many_instances: this client runs 2 instances"):
            b.launch(program, ["deaf"])
        for i in range(8):
            b.send(deaf[0], f"message {i}")
        with pytest.raises(ControlRequestError, match=r"inbox_full: the instance's inbox is full \(8 messages"):
            b.send(deaf[0], "one too many")
        for instance_id in deaf:
            b.terminate(instance_id)


def test_uploads_and_launches_name_no_paths(server, alice):
    with server.client() as client:
        for digest in ("../../../tmp/x", "A" * 64, "0" * 63):
            with pytest.raises(ControlRequestError, match="bad_upload: sha256 must be 64 lowercase hex digits"):
                client.request(c.UploadChunk("x", digest, 4, 0, b"\x00asm"))
        with pytest.raises(ControlRequestError, match="unknown_program: '/tmp/planted/x' is not a program name"):
            client.request(c.Launch("/tmp/planted/x", []))  # (launch() would look for the file here)
    with server.client(alice) as a:
        with pytest.raises(ControlRequestError, match="forbidden: only the operator may publish"):
            a.upload(built("echo"), "echo", shared=True)


# -- endpoints nobody else can take -----------------------------------------------------------------------

def test_serve_refuses_an_endpoint_another_user_could_take_or_that_is_taken(tmp_path):
    serve = [*OVEN, "serve", "--model", "tiny", "--state-dir", str(tmp_path / "state"), "--program-dir",
             str(tmp_path / "programs")]
    done = subprocess.run([*serve, "--control-endpoint", "ipc:///tmp/oven-squat-test.sock"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 1 and done.stderr.strip() == (
        "oven: cannot serve on ipc:///tmp/oven-squat-test.sock: /tmp is writable by other users, who could bind it "
        "first; use a path in a directory only you may write")
    squat = private_endpoint()
    squatter = socket.socket(socket.AF_UNIX)  # something already listens there
    squatter.bind(squat.removeprefix("ipc://"))
    squatter.listen()
    taken = f"cannot serve on {squat}: another server is listening there"
    try:
        done = subprocess.run([*serve, "--control-endpoint", squat], capture_output=True, text=True, timeout=60)
        assert done.returncode == 1 and done.stderr.strip() == f"oven: {taken}"  # at once: no model loaded
        done = subprocess.run([*serve, "--control-endpoint", private_endpoint(), "--endpoint", squat],
                              capture_output=True, text=True, timeout=120)  # the inference child's endpoint
        assert done.returncode == 1 and f"oven inference: {taken}" in done.stderr
    finally:
        squatter.close()


def test_a_squatter_on_the_inference_endpoint_hears_nothing(tmp_path):
    """The control process speaks CURVE to its child with the child's key: something else bound at that
    endpoint gets no request from it (and cannot answer one)."""
    from oven.control.inference_client import InferenceClient
    from oven.proto import inference as p

    endpoint = private_endpoint()
    squatter = zmq.Context.instance().socket(zmq.ROUTER)
    squatter.setsockopt(zmq.LINGER, 0)
    squatter.curve_server, squatter.curve_secretkey = True, Keypair.generate().secret  # another key
    squatter.bind(endpoint)
    token = Token(Keypair.generate().public, Keypair.generate())  # what a control process holds for its child
    with InferenceClient(endpoint, timeout_s=1.0, token=token) as client:
        client.send(p.InfoRequest())
        assert not squatter.poll(1000)
        with pytest.raises(TimeoutError, match="no message from the inference server"):
            client.recv()
    squatter.close()


# -- process faults ---------------------------------------------------------------------------------------

def start_decoding(client: OvenClient) -> str:
    """An instance into a long greedy completion, holding KV pages in the inference process (an instance
    that holds nothing there yet, its runner still starting, would rightly live on in the next process)."""
    total = client.info().num_kv_pages
    instance_id = client.launch(client.upload(built("text-completion-rust")), ["Once upon a time", "100000"])
    deadline = time.monotonic() + 60
    while client.stats().free_kv_pages == total:
        assert time.monotonic() < deadline, "the instance never held a KV page"
        time.sleep(0.1)
    return instance_id


@pytest.mark.parametrize("fault, flags, reason", [
    (signal.SIGKILL, [], "killed by signal 9"),  # dead
    (signal.SIGSTOP, ["--inference-timeout-s", "2"],  # hung: it answers nothing
     "no reply to a batch in 2 s (hung; oven serve --inference-timeout-s)"),
])
def test_a_dead_or_hung_inference_process_is_replaced(tmp_path, inference, fault, flags, reason):
    """The decoding instance ends with the reason, the server starts a new inference process and serves
    the next run with the right tokens."""
    srv = Server(tmp_path, *flags)
    try:
        with srv.client() as client:
            instance_id = start_decoding(client)
            (child,) = srv.children()
            os.kill(child, fault)
            event = wait_exit(client, instance_id, timeout_s=60)
            assert (event.exit_code, event.text) == (1, f"inference process died: {reason}")
        done = oven("run", "--server", srv.endpoint, "--token", srv.operator_token, "hello-rust", "--",
                    "Once upon a time", "8")
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines()[-1] == " ".join(map(str, greedy(inference, "Once upon a time", 8)))
        assert srv.children() != [child]
    except AssertionError as e:  # what the server logged says why
        srv.stop()
        raise AssertionError(f"{e}\nthe server's log:\n{srv.proc.stderr.read()}") from None
    finally:
        srv.stop()
    log = srv.proc.stderr.read()
    assert f"the inference process is gone: {reason}" in log and "restarting the inference process" in log


def greedy(inference, prompt: str, max_new: int) -> list[int]:
    """Greedy tokens from a separate inference process on the same (seeded) tiny model."""
    with inference.client() as client:
        info = client.info()
        tok = Tokenizer(info.tokenizer)
        return greedy_generate(client, tok.encode(prompt), max_new, tok.stop_token_ids, info.page_size,
                               info.num_kv_pages).token_ids


def test_the_inference_child_dies_with_its_control_process(tmp_path):
    srv = Server(tmp_path)
    (child,) = srv.children()
    srv.proc.kill()
    srv.proc.wait()
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child}").exists() and Path(f"/proc/{child}/stat").read_text().split()[2] != "Z":
        assert time.monotonic() < deadline, "the inference process outlived its control process"
        time.sleep(0.05)


def test_a_client_of_a_server_that_restarted_is_told(tmp_path):
    first = Server(tmp_path)
    with first.client() as client:
        instance_id = client.launch(client.upload(built("text-completion-rust")), ["Once upon a time", "100000"])
        first.proc.kill()
        first.proc.wait()
        second = Server(tmp_path, endpoint=first.endpoint)  # same endpoint, same keys: the client reconnects
        try:
            with pytest.raises(ServerRestarted, match="restarted: what this client launched there is gone"):
                wait_exit(client, instance_id)
        finally:
            second.stop()


# -- folders another local user could have written (issue 40, row 10) --------------------------------------

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to plant files as a second local user")
NOBODY = 65534


def plant(path: Path, files: dict[str, str]) -> Path:
    """``path`` and ``files`` in it, as another local user (uid NOBODY) would have made them."""
    path.mkdir(parents=True)
    for name, text in files.items():
        (path / name).write_text(text)
    for p in (path, *path.iterdir()):
        os.chown(p, NOBODY, NOBODY)
    return path


@needs_root
def test_a_model_folder_another_user_made_in_the_cache_is_refused(tmp_path):
    """Another user pre-created OVEN_CACHE_DIR/models/<model>/ with a chat template of theirs: neither
    `prepare-model` nor `serve` (whose inference process converts into that folder) reads it."""
    from oven.inference.models import EMBEDDED_MODELS, embedded_gguf_path, gguf_key

    (name,) = EMBEDDED_MODELS
    gguf = embedded_gguf_path(name)
    cache = tmp_path / "cache"
    folder = plant(cache / "models" / f"{gguf.stem}-{gguf_key(gguf)}",
                   {"config.json": "{}", "chat_template.jinja": "{{ 'planted' }}"})
    env = {**os.environ, "OVEN_CACHE_DIR": str(cache)}
    refused = (f"refusing {folder}: it belongs to nobody (uid {NOBODY}), neither you nor root (choose another "
               "OVEN_CACHE_DIR)")
    done = subprocess.run([*OVEN, "prepare-model", name], capture_output=True, text=True, env=env, timeout=120)
    assert (done.returncode, done.stderr) == (1, f"oven: {name}: {refused}\n")
    for path in (folder, folder / "config.json"):  # the victim's now; the template is still the other user's
        os.chown(path, 0, 0)
    done = subprocess.run([*OVEN, "serve", "--model", "tiny", "--state-dir", str(tmp_path / "state"), "--program-dir",
                           str(tmp_path / "programs"), "--control-endpoint", f"ipc://{tmp_path / 'c.sock'}"],
                          capture_output=True, text=True, env=env, timeout=120)  # tiny borrows that tokenizer
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert (f"oven inference: refusing {folder / 'chat_template.jinja'}: it belongs to nobody (uid {NOBODY}), "
            "neither you nor root (choose another OVEN_CACHE_DIR)\n") in done.stderr


@needs_root
def test_folders_writable_by_others_are_refused_along_the_whole_path(tmp_path):
    """ssh's StrictModes for every folder oven keeps: a parent writable by others (who could rename the
    victim's 0700 state folder away and put theirs in its place) is refused as the folder itself is; a
    group counts unless no one else is in it; a root-owned sticky folder such as /tmp is fine above."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    state = shared / "server"
    with pytest.raises(AuthError, match=f"^refusing {state}: {shared} is writable by others "
                                        rf"\(chmod o-w {shared}, or choose another state_dir\)$"):
        Keyring(state)
    assert not state.exists()
    done = oven("serve", "--model", "tiny", "--state-dir", str(state), "--program-dir", str(tmp_path / "programs"))
    assert (done.returncode, done.stderr) == (2, f"oven: refusing {state}: {shared} is writable by others (chmod o-w "
                                                 f"{shared}, or choose another state_dir)\n")  # before the model loads
    os.chown(shared, 0, pwd.getpwuid(NOBODY).pw_gid)  # writable by a group another user is in
    shared.chmod(0o775)
    with pytest.raises(AuthError, match=f"^refusing {shared / 'programs'}: {shared} is writable by group"):
        ProgramStore(shared / "programs", wasmtime.Engine(engine_config()))
    with pytest.raises(AuthError, match=f"^refusing {shared}: writable by group"):
        AdapterStore(shared).names()
    os.chown(shared, 0, 0)  # a group no one else is in (root's, here): harmless
    assert Keyring(state).names() == ["operator"]
    shared.chmod(0o1777)  # sticky, as /tmp: only an entry's owner may rename it
    assert Keyring(state).names() == ["operator"]
    shared.chmod(0o777)
    (state / "own").mkdir()
    with pytest.raises(AuthError, match=f"^refusing {state / 'own'}: {shared} is writable by others"):
        private_dir(state / "own")  # not sticky any more


@needs_root
def test_a_stored_adapter_another_user_made_is_not_loaded(tmp_path, caplog):
    store = AdapterStore(tmp_path / "adapters")
    for name in ("mine", "theirs"):
        (store.root / name).mkdir(parents=True)
        for file in ADAPTER_FILES:
            (store.root / name / file).write_text("{}")
    os.chown(store.root / "theirs" / ADAPTER_FILES[0], NOBODY, NOBODY)
    with caplog.at_level("WARNING"):
        assert store.names() == ["mine"]
    assert (f"ignoring the stored adapter theirs: refusing {store.root / 'theirs' / ADAPTER_FILES[0]}: it belongs "
            f"to nobody (uid {NOBODY})") in caplog.text


# -- a token never silently on the command line (issue 40, row 11) ---------------------------------------

def test_a_token_on_the_command_line_works_with_a_warning(server, alice, tmp_path):
    """argv is every local user's to read (`ps`): a token given there still works, with one line naming
    the forms no one else can read, which say nothing."""
    done = oven("ps", "--server", server.endpoint, "--token", alice)
    assert (done.returncode, done.stderr) == (0, TOKEN_IN_ARGV + "\n")
    assert TOKEN_IN_ARGV == ("oven: warning: a token given on the command line is visible to every local user (ps); "
                             "pass --token @FILE, or set OVEN_TOKEN, instead")
    token_file = tmp_path / "alice.token"
    token_file.write_text(alice + "\n")
    token_file.chmod(0o600)
    for how in ({"args": ("--token", f"@{token_file}")}, {"env": {"OVEN_TOKEN": alice}},
                {"env": {"OVEN_TOKEN": f"@{token_file}"}}):
        done = subprocess.run([*OVEN, "ps", "--server", server.endpoint, *how.get("args", ())], capture_output=True,
                              text=True, env={**os.environ, **how.get("env", {})}, timeout=120)
        assert (done.returncode, done.stderr) == (0, ""), how


# -- a full disk: an upload or a keyring change is whole or not at all (issue 40, row 12) ----------------

def full_disk(monkeypatch, where: str) -> None:
    """The disk fills while a file whose path holds ``where`` is written: half its bytes go, then ENOSPC."""
    real_write, wrote = os.write, []

    def write(fd: int, data) -> int:
        if where not in os.readlink(f"/proc/self/fd/{fd}"):
            return real_write(fd, data)
        if wrote:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        wrote.append(fd)
        return real_write(fd, memoryview(data)[:len(data) // 2])
    monkeypatch.setattr(os, "write", write)


def test_an_upload_on_a_full_disk_leaves_nothing(tmp_path, monkeypatch):
    """Whether the disk fills in the compiled code, the .wasm or names.json, nothing of the program stays
    (no file outside every client's quota, no temporary file), and nothing of it is known; with room
    again the same upload is stored whole. A known program recorded for another client on a full disk
    stays the first client's alone."""
    store = ProgramStore(tmp_path / "programs", wasmtime.Engine(engine_config()))
    compiled = store.compile(built("hello-rust"))
    before = sorted(os.listdir(store.root))
    for where in (".cwasm.tmp", ".wasm.tmp", "names.json"):
        with monkeypatch.context() as patch:
            full_disk(patch, where)
            with pytest.raises(OSError, match="No space left on device"):
                store.add_compiled(compiled, "hello", uploader="alice")
        assert sorted(os.listdir(store.root)) == before, where
        assert not store.has(compiled.digest) and store.entries() == []
        with pytest.raises(ProgramError, match="no program named or hashed 'hello'"):
            store.resolve("hello", "alice")
    assert store.add_compiled(compiled, "hello", uploader="alice") == compiled.digest
    names = (store.root / "names.json").read_bytes()
    with monkeypatch.context() as patch:
        full_disk(patch, "names.json")
        with pytest.raises(OSError, match="No space left on device"):
            store.add_compiled(compiled, "mine", uploader="bob")
    assert not store.may_run(compiled.digest, "bob") and (store.root / "names.json").read_bytes() == names
    restarted = ProgramStore(store.root, store.engine)
    assert restarted.resolve("hello", "alice") == compiled.digest and not restarted.may_run(compiled.digest, "bob")
    assert len(list(store.root.glob("*tmp*"))) == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount a small tmpfs")
def test_an_upload_on_a_really_full_disk_leaves_nothing(tmp_path):
    """The same on a real full disk: a tmpfs with room for the store's key and the compiled code, not the
    .wasm (an upload used to leave its compiled code there, outside every quota)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    engine = wasmtime.Engine(engine_config())
    compiled = ProgramStore(tmp_path / "scratch", engine).compile(built("hello-rust"))
    page = os.sysconf("SC_PAGE_SIZE")
    room = page + -(-(len(compiled.code) + 64) // page) * page + len(compiled.wasm) // 2
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={room},mode=0755", "tmpfs", str(disk)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        store = ProgramStore(disk / "programs", engine)
        with pytest.raises(OSError, match="No space left on device"):
            store.add_compiled(compiled, "hello", uploader="alice")
        assert os.listdir(store.root) == ["code.key"] and store.entries() == []
        subprocess.run(["mount", "-o", f"remount,size={room * 4}", str(disk)], check=True)
        assert store.add_compiled(compiled, "hello", uploader="alice") == compiled.digest
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_a_keyring_change_on_a_full_disk_changes_nothing(tmp_path, monkeypatch):
    """`oven token add` used to admit a client in memory whose key was never saved (nor its token shown):
    now a change that cannot be saved is not made."""
    keyring = Keyring(tmp_path / "state")
    keyring.add("alice")

    def state():
        return {p.name: p.read_bytes() for p in keyring.dir.iterdir()}, keyring.names(), keyring.admitted()
    before = state()
    for change in (lambda: keyring.add("bob"), lambda: keyring.remove("alice")):
        with monkeypatch.context() as patch:
            full_disk(patch, "clients.json")
            with pytest.raises(OSError, match="No space left on device"):
                change()
        assert state() == before
    keyring.add("bob")  # room again: not "a client named 'bob' exists"
    keyring.remove("alice")
    assert Keyring(tmp_path / "state").names() == ["bob", "operator"]


def test_a_server_sweeps_the_private_folders_killed_processes_left(monkeypatch, tmp_path):
    """A private endpoint folder older than STALE_AFTER_S goes when it is empty or its sockets refuse
    connections (their process was killed); one whose socket listens, a young one, and anything that is not
    such a folder stay."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    old = time.time() - endpoints.STALE_AFTER_S - 1

    def folder(name: str, *, sockets: int = 0, listening: bool = False, age: float = old) -> Path:
        path = tmp_path / (endpoints.PRIVATE_PREFIX + name)
        path.mkdir()
        for i in range(sockets):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.bind(str(path / f"{i}.sock"))
            if listening:
                sock.listen()
                kept.append(sock)
            else:
                sock.close()  # its file stays, as after a SIGKILL
        os.utime(path, (age, age))
        return path

    kept = []
    gone = [folder("empty"), folder("dead", sockets=2)]
    stay = [folder("listening", sockets=1, listening=True), folder("young", sockets=1, age=time.time()),
            folder("young-empty", age=time.time())]
    (plain := tmp_path / (endpoints.PRIVATE_PREFIX + "file")).write_text("x")
    (other := folder("with-a-file")).joinpath("notes").write_text("x")
    os.utime(other, (old, old))
    assert endpoints.sweep_stale_private_folders() == 2
    assert not any(path.exists() for path in gone) and all(path.exists() for path in [*stay, plain, other])
    for sock in kept:
        sock.close()
