"""A new user's journey through the ``oven`` CLI, mistakes included, as real processes (tiny model):
new → build → run → serve → upload by name → run by name → detach → send → attach → kill → ps.

Every verb finds the server as ``serve`` does (here through ``OVEN_CONTROL_ENDPOINT`` and
``OVEN_STATE_DIR``); every mistake ends in the exact one line asserted; no verb ever shows a traceback.
The tests run in order and share one server and one built inferlet.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness import PROGRAM_DIR

from oven.client.rpc import OvenClient

HOST_FRAME = re.compile(r'^  File "(?!/\d+/)', re.M)
NOT_THERE = "oven: no server answers at {} (start one with `oven serve`)\n"


def oven(*args: str, cwd: Path, env: dict, status: int | None = 0, stdout=subprocess.PIPE,
         timeout_s: float = 300) -> subprocess.CompletedProcess:
    """Run the CLI as a user would; no traceback of the CLI may reach them, whatever the outcome (an
    inferlet's own, whose frames are in the sandbox's /0/, /1/, ..., is its output)."""
    done = subprocess.run([sys.executable, "-m", "oven.client.cli", *args], cwd=cwd, env=env, stdout=stdout,
                          stderr=subprocess.PIPE, text=True, timeout=timeout_s, check=False)
    assert not HOST_FRAME.search(done.stderr), done.stderr
    if status is not None:
        assert done.returncode == status, (done.returncode, done.stderr)
    return done


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("journey")


@pytest.fixture(scope="module")
def env(home) -> dict:
    """The user's environment: where their server is, for every verb, serve included."""
    state = home / "state"
    return {**os.environ, "OVEN_CONTROL_ENDPOINT": f"ipc://{state}/control.sock", "OVEN_STATE_DIR": str(state),
            "OVEN_PROGRAM_DIR": PROGRAM_DIR}


@pytest.fixture(scope="module")
def server(home, env):
    proc = subprocess.Popen([sys.executable, "-m", "oven.client.cli", "serve", "--model", "tiny", "--quiet"],
                            cwd=home, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    state = Path(env["OVEN_STATE_DIR"])
    deadline = time.monotonic() + 180
    while not (state / "operator.token").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.2)
    with OvenClient(env["OVEN_CONTROL_ENDPOINT"], token=(state / "operator.token").read_text()) as client:
        while not client.reachable(timeout_s=1.0):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
    yield proc
    proc.terminate()
    assert proc.wait(30) == 0


def test_new_and_a_run_before_the_build(home, env):
    made = oven("new", "hello", cwd=home, env=env)
    assert made.stdout == ('created hello/ (python); edit hello/app.py, then\n  oven build hello\n'
                           '  oven run hello -- "Why is the sky blue?"\n')
    assert oven("run", "hello", cwd=home, env=env, status=2).stderr == \
        "oven: hello is not built yet: run `oven build hello`\n"


def test_a_build_with_an_import_the_sandbox_lacks_fails_at_once(home, env):
    app = home / "hello" / "app.py"
    source = app.read_text()
    app.write_text(source.replace("import inferlet\n", "import inferlet\nimport requests\n"))
    try:
        failed = oven("build", "hello", cwd=home, env=env, status=1)
    finally:
        app.write_text(source)
    assert failed.stderr.splitlines()[0] == (
        "oven: error: hello/app.py:10: import requests: no module 'requests' in the inferlet's module path (its "
        "folder, the SDK and the sandbox's standard library). Packages installed on this machine are not bundled, "
        "and compiled extension modules cannot run in the sandbox; a pure-Python module can be copied into the "
        "inferlet's folder.")


def test_build_then_run_the_folder(home, env, server):
    app = home / "hello" / "app.py"  # syntax newer than the host's Python: the sandbox's parser judges it
    app.write_text(app.read_text().replace("USAGE = ", "type Tokens = list[int]\nUSAGE = ")
                   + f"# built at {time.time_ns()}: a program the server has never compiled\n")
    built = oven("build", "hello", cwd=home, env=env)
    assert re.fullmatch(r"oven: building hello \(Python, componentize-py; about 15 s\) \.\.\.\n"
                        r"oven: built hello/hello\.wasm \(\d+\.\d MB\) in \d+\.\d s\n", built.stderr)
    ran = oven("run", "hello", "--", "Hi", "4", cwd=home, env=env)
    assert ran.stderr == "oven: uploading hello; the server compiles it once (about 15 s for a Python inferlet) ...\n"
    assert ran.stdout.endswith("\n") and ran.stdout.count("\n") >= 1
    again = oven("run", "hello", "--", "Hi", "4", cwd=home, env=env)
    assert (again.stdout, again.stderr) == (ran.stdout, "")  # compiled once: nothing to say the second time
    usage = oven("run", "hello", cwd=home, env=env, status=1)
    assert usage.stderr == "usage: hello PROMPT [MAX_NEW_TOKENS]\n"


def test_serve_on_an_address_in_use_fails_at_once(home, env, server):
    taken = oven("serve", "--model", "tiny", cwd=home, env=env, status=1)
    assert taken.stderr == f"oven: cannot serve on {env['OVEN_CONTROL_ENDPOINT']}: another server is listening there\n"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        tcp = oven("serve", "--model", "tiny", "--control-endpoint", f"tcp://127.0.0.1:{port}", cwd=home, env=env,
                   status=1)
        assert tcp.stderr == f"oven: cannot serve on tcp://127.0.0.1:{port}: the address is in use\n"
        api = oven("serve", "--model", "tiny", "--control-endpoint", f"ipc://{home}/other.sock", "--openai-port",
                   str(port), cwd=home, env=env, status=1)
        assert api.stderr == f"oven: cannot serve the OpenAI API on http://127.0.0.1:{port}/v1: the address is in use\n"


@pytest.mark.parametrize("verb", [["ps"], ["ps", "--programs"], ["kill", "1-x"], ["send", "1-x", "hi"],
                                  ["attach", "1-x"], ["logs", "1-x"], ["upload", "echo"], ["exports"],
                                  ["token", "list"], ["run", "echo"]])
def test_every_verb_says_at_once_that_no_server_answers(home, env, verb):
    nowhere = f"ipc://{home}/nowhere.sock"
    done = oven(*verb, cwd=home, env={**env, "OVEN_CONTROL_ENDPOINT": nowhere}, status=1, timeout_s=10)
    assert done.stderr == NOT_THERE.format(nowhere)


def test_verbs_read_the_config_file_as_serve_does(home, env, server):
    config = home / "oven.toml"
    config.write_text(f'[control]\ncontrol_endpoint = "{env["OVEN_CONTROL_ENDPOINT"]}"\n'
                      f'state_dir = "{env["OVEN_STATE_DIR"]}"\n')
    bare = {k: v for k, v in env.items() if k not in ("OVEN_CONTROL_ENDPOINT", "OVEN_STATE_DIR")}
    ids = lambda done: [line.split()[0] for line in done.stdout.splitlines()]  # noqa: E731 - ages differ
    listed = ids(oven("ps", "--config", str(config), cwd=home, env=bare))
    assert listed[0] == "INSTANCE" and len(listed) > 1
    assert ids(oven("ps", cwd=home, env={**bare, "OVEN_CONFIG": str(config)})) == listed


def test_upload_by_name_then_run_by_name_and_a_typo(home, env, server):
    uploaded = oven("upload", "hello", "--name", "greeter", cwd=home, env=env)
    assert re.fullmatch(r"[0-9a-f]{64}\n", uploaded.stdout)
    by_folder = oven("run", "hello", "--", "Hi", "4", cwd=home, env=env)
    by_name = oven("run", "greeter", "--", "Hi", "4", cwd=Path("/"), env=env)
    assert by_name.stdout == by_folder.stdout
    typo = oven("run", "greeterr", cwd=home, env=env, status=2)
    assert typo.stderr == ("oven: no program 'greeterr': not a .wasm file, an inferlet folder, a library inferlet or "
                           "a program uploaded to the server; did you mean greeter?\n")
    library_typo = oven("run", "text-compleion", cwd=home, env=env, status=2)
    assert library_typo.stderr.endswith("; did you mean text-completion, text-completion-rust or chat-completion?\n")
    missing = oven("run", "hello/nothing.wasm", cwd=home, env=env, status=2)
    assert missing.stderr == "oven: hello/nothing.wasm: no such file\n"


def test_detach_send_attach_kill_and_ps(home, env, server):
    first = oven("run", "--detach", "echo", cwd=home, env=env).stdout.strip()
    assert oven("send", first, "hello", cwd=home, env=env).stdout == f"sent 5 bytes to {first}\n"
    assert oven("send", first, "bye", cwd=home, env=env).stdout == f"sent 3 bytes to {first}\n"
    attached = oven("attach", first, cwd=home, env=env)  # ended already: its whole output, replayed
    assert (attached.stdout, attached.stderr) == ("echo: hello\necho: bye\n", "")
    second = oven("run", "--detach", "echo", cwd=home, env=env).stdout.strip()
    assert oven("kill", second, cwd=home, env=env).stdout == f"killed {second}\n"
    logs = oven("logs", second, cwd=home, env=env, status=143)
    assert logs.stderr == f"oven: {second} was killed: terminated by a client\n"
    broken = '{"prompt": "Hi", "max_tokens": "x"}'  # an exception in the inferlet: its traceback once
    failed = oven("run", "chat-completion", "--", broken, cwd=home, env=env, status=1)
    failure = "TypeError: '<' not supported between instances of 'int' and 'str'"
    assert failed.stderr.count("Traceback (most recent call last)") == 1
    assert failed.stderr.count(failure) == 2 and "panicked" not in failed.stderr
    third = re.search(r"^oven: (\S+) failed: (.*)$", failed.stderr, re.M)
    assert third[2] == failure
    rows = {line.split()[0]: line.split() for line in oven("ps", cwd=home, env=env).stdout.splitlines()[1:]}
    assert rows[first][1:4] == ["echo", "operator", "finished"] and rows[first][5] == "0"
    assert rows[second][1:4] == ["echo", "operator", "killed"] and rows[second][5:] == ["143", "terminated", "by",
                                                                                         "a", "client"]
    assert rows[third[1]][1:4] == ["chat-completion", "operator", "failed"] and rows[third[1]][5] == "1"


def test_a_closed_pipe_ends_quietly(home, env, server):
    for verb in (["ps"], ["run", "hello", "--", "Hi", "32"]):
        proc = subprocess.Popen([sys.executable, "-m", "oven.client.cli", *verb], cwd=home, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        proc.stdout.close()  # `| head` that has read enough before a byte was written
        _, stderr = proc.communicate(timeout=120)
        assert (proc.returncode, stderr) == (141, ""), stderr
