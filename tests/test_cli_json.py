"""The scriptable CLI against one real ``oven serve`` (tiny model): ``--json`` on the listing verbs (one
JSON document on stdout, keyed by the protocol's field names), ``oven info`` of a running server, a Rust
inferlet's ``Err`` seen as a failure, and the names ``oven ps`` gives instances of programs that share
a name.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness import seed_store

from oven.client.rpc import OvenClient
from oven.proto.endpoints import default_inference_endpoint
from oven.proto import control as c


def keys(message: type) -> list[str]:
    return [f.name for f in dataclasses.fields(message)]


@pytest.fixture(scope="module")
def env(tmp_path_factory, tokenizer_donor) -> dict:
    """A user of a fresh server whose program store starts empty (library names of its own)."""
    home = tmp_path_factory.mktemp("cli-json")
    seed_store(home / "programs", "echo")  # compiled already (no names: the store's names start empty)
    return {**os.environ, "OVEN_CONTROL_ENDPOINT": f"ipc://{home}/state/control.sock",
            "OVEN_STATE_DIR": str(home / "state"), "OVEN_PROGRAM_DIR": str(home / "programs"),
            "OVEN_CACHE_DIR": str(home / "cache"), "OVEN_TOKENIZER_DONOR": tokenizer_donor}


def oven(*args: str, env: dict, status: int | None = 0) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "oven.client.cli", *args], env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert "Traceback" not in done.stderr, done.stderr
    assert status is None or done.returncode == status, (done.returncode, done.stderr)
    return done


def as_json(*args: str, env: dict) -> dict:
    return json.loads(oven(*args, "--json", env=env).stdout)  # nothing but the document on stdout


@pytest.fixture(scope="module")
def server(env):
    proc = subprocess.Popen([sys.executable, "-m", "oven.client.cli", "serve", "--model", "tiny", "--quiet"],
                            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    token, deadline = Path(env["OVEN_STATE_DIR"]) / "operator.token", time.monotonic() + 180
    while not token.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.2)
    with OvenClient(env["OVEN_CONTROL_ENDPOINT"], token=token.read_text()) as client:
        while not client.reachable(timeout_s=1.0):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
    yield proc
    proc.terminate()
    assert proc.wait(30) == 0


def test_ps_json(env, server):
    instance_id = oven("run", "echo", "--detach", env=env).stdout.strip()
    try:
        deadline = time.monotonic() + 60
        while True:  # detached, it is "ready" until its runner has run it to its wait for a message
            (entry,) = [i for i in as_json("ps", env=env)["instances"] if i["instance_id"] == instance_id]
            if entry["state"] != "ready" or time.monotonic() > deadline:
                break
        assert list(entry) == keys(c.InstanceEntry)
        assert {k: entry[k] for k in ("program", "state", "exit_code", "error", "owner", "replica")} == {
            "program": "echo", "state": "waiting", "exit_code": None, "error": "", "owner": "operator", "replica": 0}
        (program,) = [p for p in as_json("ps", "--programs", env=env)["programs"] if "operator:echo" in p["names"]]
        assert list(program) == keys(c.ProgramEntry) and program["sha256"].startswith(instance_id.split("-")[1])
    finally:
        oven("kill", instance_id, env=env)


def test_a_rust_err_fails_with_its_message(env, server):
    done = oven("run", "text-completion-rust", "--", "prompt", "--n", "0", env=env, status=1)
    assert done.stdout == "error: --n must be at least 1\n"
    instance_id = done.stderr.splitlines()[-1].split()[1]
    assert done.stderr.splitlines()[-1] == f"oven: {instance_id} failed: --n must be at least 1"
    (entry,) = [i for i in as_json("ps", env=env)["instances"] if i["instance_id"] == instance_id]
    assert (entry["state"], entry["exit_code"], entry["error"]) == ("failed", 1, "--n must be at least 1")


def test_exports_json(env, server):
    oven("run", "text-completion-rust", "--", "Once upon a time", "2", "--export", "story", env=env)
    (export,) = as_json("exports", env=env)["exports"]
    assert list(export) == keys(c.ExportEntry)
    assert {k: export[k] for k in ("name", "num_pages", "exporter_running", "owner")} == {
        "name": "story", "num_pages": 1, "exporter_running": False, "owner": "operator"}
    oven("exports", "--drop", "story", env=env)
    assert as_json("exports", env=env) == {"exports": []}


def test_stats_json(env, server):
    stats = as_json("stats", env=env)
    assert list(stats) == keys(c.StatsReply) and list(stats["profile"]) == keys(c.InterceptionProfile)
    (replica,) = stats["replicas"]
    assert list(replica) == keys(c.ReplicaStats) and replica["serving"] is True
    assert stats["num_batches"] > 0 and stats["interception_policy"] == "infercept"


def test_adapters_json(env, server):
    assert as_json("adapters", env=env) == {"adapters": []}  # tiny serves no adapter (asynclm is SmolLM2's)
    done = oven("adapters", "remove", "x", "--json", env=env, status=2)
    assert done.stderr == "oven adapters remove: --json goes with list and add\n"


def test_token_json(env, server):
    added = as_json("token", "add", "alice", env=env)
    assert list(added) == keys(c.ClientToken) and added["name"] == "alice" and added["token"].startswith("oven-")
    assert as_json("token", "list", env=env) == {"names": ["alice", "operator"]}


def test_info_asks_the_running_server(env, server):
    info = as_json("info", env=env)
    assert list(info) == [*keys(c.ServerInfoReply), "interception_policy", "replicas", "adapters"]
    assert (info["models"], info["device"], info["client"], info["adapters"]) == (["tiny"], "cpu", "operator", [])
    lines = oven("info", env=env).stdout.splitlines()
    assert lines[0].split() == ["server", env["OVEN_CONTROL_ENDPOINT"]]
    assert ["models", "tiny"] in [line.split() for line in lines]
    assert ["replicas", "0", "serving"] in [line.split() for line in lines]


def test_ps_names_which_program_of_a_shared_name_ran(env, server):
    """An instance is shown by the name it was launched by while that name means its program; the
    library's program once the client's own copy takes the name (library:NAME); an earlier upload
    the name has moved on from with its hash (NAME@HASH, as in instance ids)."""
    oven("upload", "echo", "--name", "greet", "--shared", env=env)
    from_library = oven("run", "greet", "--detach", env=env).stdout.strip()
    first_copy = oven("upload", "hello-rust", "--name", "greet", env=env).stdout.strip()
    oven("run", "greet", "--", "Hi", "2", env=env)
    second_copy = oven("upload", "text-completion-rust", "--name", "greet", env=env).stdout.strip()
    try:
        names = {i["instance_id"]: i["program"] for i in as_json("ps", env=env)["instances"]}
        (first_run,) = [i for i in names if i.endswith(f"-{first_copy[:8]}")]
        assert (names[from_library], names[first_run]) == ("library:greet", f"greet@{first_copy[:8]}")
        oven("run", "greet", "--", "Hi", "2", env=env)
        names = {i["instance_id"]: i["program"] for i in as_json("ps", env=env)["instances"]}
        # the same program's earlier instances (test_exports_json's) keep the name they were launched by
        assert {n for i, n in names.items() if i.endswith(f"-{second_copy[:8]}")} == {"greet", "text-completion-rust"}
    finally:
        oven("kill", from_library, env=env)



def test_info_of_a_stand_alone_inference_process(tmp_path, monkeypatch, tokenizer_donor):
    """With no control server to ask, `oven info` asks this user's `oven inference`; --endpoint names one."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("OVEN_")},
           "OVEN_STATE_DIR": str(tmp_path / "state"), "OVEN_CACHE_DIR": str(tmp_path / "cache"),
           "OVEN_TOKENIZER_DONOR": tokenizer_donor}
    proc = subprocess.Popen([sys.executable, "-m", "oven.client.cli", "inference", "--model", "tiny", "--quiet",
                             "--num-kv-pages", "64", "--torch-threads", "1"], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while (done := oven("info", "--json", env=env, status=None)).returncode:
            assert proc.poll() is None and time.monotonic() < deadline, (done.stderr, proc.stderr.read())
            time.sleep(0.5)
        info = json.loads(done.stdout)
        assert (info["model_name"], info["device"], info["num_kv_pages"]) == ("tiny", "cpu", 64)
        assert "tokenizer" not in info and isinstance(info["stop_token_ids"], list)
        for name in ("OVEN_STATE_DIR", "OVEN_CACHE_DIR"):
            monkeypatch.setenv(name, env[name])
        by_endpoint = oven("info", "--endpoint", default_inference_endpoint(), env=env).stdout.splitlines()
        assert ["model_name", "tiny"] in [line.split() for line in by_endpoint]
    finally:
        proc.terminate()
        proc.wait(30)
