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
from harness import fresh_program, seed_store

from oven.client.programs import library_program
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
    """The user's environment: where their server is, for every verb, serve included. Its program store is
    its own (the programs built here are new each run), seeded with the library programs it runs."""
    state = home / "state"
    programs = seed_store(home / "programs", "echo", "chat-completion", "asynclm")
    return {**os.environ, "OVEN_CONTROL_ENDPOINT": f"ipc://{state}/control.sock", "OVEN_STATE_DIR": str(state),
            "OVEN_PROGRAM_DIR": str(programs)}


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
        "oven: error: hello/app.py:11: import requests: no module 'requests' in the inferlet's module path (its "
        "folder, the SDK and the sandbox's standard library). Packages installed on this machine are not bundled, "
        "and compiled extension modules cannot run in the sandbox; a pure-Python module can be copied into the "
        "inferlet's folder.")


def test_build_then_run_the_folder(home, env, server):
    app = home / "hello" / "app.py"  # syntax newer than the host's Python: the sandbox's parser judges it
    app.write_text(app.read_text().replace("ARGS = ", "type Tokens = list[int]\nARGS = ")
                   + f"# built at {time.time_ns()}: a program the server has never compiled\n")
    built = oven("build", "hello", cwd=home, env=env)
    assert re.fullmatch(r"oven: building hello \(Python, componentize-py; about 15 s\) \.\.\.\n"
                        r"oven: built hello/hello\.wasm \(\d+\.\d MB\) in \d+\.\d s\n", built.stderr)
    ran = oven("run", "hello", "--", "Hi", "4", cwd=home, env=env)
    assert ran.stderr == "oven: uploading hello; the server compiles it once (about 15 s for a Python inferlet) ...\n"
    assert ran.stdout.endswith("\n") and ran.stdout.count("\n") >= 1
    again = oven("run", "hello", "--", "Hi", "4", cwd=home, env=env)
    assert (again.stdout, again.stderr) == (ran.stdout, "")  # compiled once: nothing to say the second time
    usage = oven("run", "hello", cwd=home, env=env, status=2)  # argparse's, in the inferlet
    assert usage.stderr == ("usage: hello [-h] PROMPT [MAX_NEW_TOKENS]\n"
                            "hello: error: the following arguments are required: PROMPT\n")
    helped = oven("run", "hello", "--", "--help", cwd=home, env=env)
    assert helped.stdout.startswith("usage: hello [-h] PROMPT [MAX_NEW_TOKENS]\n\na chat completion on oven's Python SDK")


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


def test_a_dropped_program_is_gone(home, env, server):
    # A digest no other step uses: a drop deletes the program's files, and echo's (seeded) would then be
    # compiled again by the steps after this one.
    (home / "to-drop.wasm").write_bytes(fresh_program("hello-rust"))
    digest = oven("upload", "to-drop.wasm", cwd=home, env=env).stdout.strip()
    assert "to-drop" in oven("ps", "--programs", cwd=home, env=env).stdout
    assert oven("ps", "--programs", "--drop", "to-drop", cwd=home, env=env).stdout == "dropped to-drop\n"
    assert digest[:16] not in oven("ps", "--programs", cwd=home, env=env).stdout  # no client had it any more
    gone = oven("ps", "--programs", "--drop", "to-drop", cwd=home, env=env, status=1)
    assert gone.stderr == "oven: unknown_program: no program named or hashed 'to-drop'\n"
    assert oven("ps", "--drop", "x", cwd=home, env=env, status=2).stderr == (
        "oven: --drop forgets programs: give it with --programs\n")


def test_ctrl_c_in_an_asynclm_session_stops_its_instance(home, env, server):
    """As `oven run` does: an instance left running would hold its pages until the lease lapsed."""
    from oven.client.asynclm.session import demo_workload, run_session, session_spec

    def interrupt(_message):
        raise KeyboardInterrupt

    token = (Path(env["OVEN_STATE_DIR"]) / "operator.token").read_text()
    with OvenClient(env["OVEN_CONTROL_ENDPOINT"], token=token) as client:
        program = client.upload(library_program("asynclm").path.read_bytes(), "asynclm")
        workload = demo_workload(None, plan=True)
        with pytest.raises(KeyboardInterrupt):
            run_session(client, program, workload, session_spec(workload, "async", max_tokens=64), interrupt)
        (killed,) = [i for i in client.instances() if i.program == "asynclm"]
        assert (killed.state, killed.exit_code, killed.error) == ("killed", 143, "terminated by a client")


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
    # INSTANCE PROGRAM OWNER STATE AGE CPU REPLICA EXIT ERROR
    assert rows[first][1:4] == ["echo", "operator", "finished"] and rows[first][6:8] == ["0", "0"]
    assert rows[second][1:4] == ["echo", "operator", "killed"] and rows[second][7:] == ["143", "terminated", "by",
                                                                                         "a", "client"]
    assert rows[third[1]][1:4] == ["chat-completion", "operator", "failed"] and rows[third[1]][7] == "1"
    assert all(re.fullmatch(r"\d+\.\d\ds", row[5]) and row[6] == "0" for row in rows.values())


def test_a_closed_pipe_ends_quietly(home, env, server):
    for verb in (["ps"], ["run", "hello", "--", "Hi", "32"]):
        proc = subprocess.Popen([sys.executable, "-m", "oven.client.cli", *verb], cwd=home, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        proc.stdout.close()  # `| head` that has read enough before a byte was written
        _, stderr = proc.communicate(timeout=120)
        assert (proc.returncode, stderr) == (141, ""), stderr


# -- mistakes said in one line, before any slow work, losing nothing (no server, no model load) --------------

TOKEN = "oven-" + "ab" * 32 + "-" + "cd" * 32
UNKNOWN_MODEL = ("oven: unknown model {!r}: expected smollm2-135m-instruct, tiny, dummy:<shape>, a .gguf file or a "
                 "Hugging Face folder with config.json")
BAD_ENDPOINT = "oven: bad endpoint 'garbage': Invalid argument (expected ipc://PATH or tcp://HOST:PORT)"
BFCL_TOOLS = ("oven: --tools {!r}: expected demo, bfcl:KIND (KIND one of parallel, live_parallel, multi_turn, "
              "multi_step_parallel), a tools file (FILE.py), mcp:URL or mcp-stdio:COMMAND")
MISTAKES = [  # (argv, extra environment, status, the last line of stderr: a string, or a pattern)
    # a config file's setting of the wrong type, or a section that is no table
    (["ps", "--config", "wrong-type.toml"], {}, 2,
     "oven: wrong-type.toml: [control] max_instances: expected int, got str 'x'"),
    (["serve", "--model", "tiny", "--config", "wrong-type.toml"], {}, 2,
     "oven: wrong-type.toml: [control] max_instances: expected int, got str 'x'"),
    (["ps", "--config", "not-a-table.toml"], {}, 2,
     "oven: not-a-table.toml: control must be a table ([control]), not int"),
    (["serve", "--model", "tiny", "--config", "int-for-bool.toml"], {}, 2,
     "oven: int-for-bool.toml: [inference] cpu_packed_weights: expected a boolean, got int 1"),
    (["serve", "--cpu-packed-weights", "maybe"], {}, 2,
     "oven serve: error: argument --cpu-packed-weights: invalid boolean value: 'maybe'"),
    (["serve", "--dispatch-policy", "lazy"], {}, 2, "oven serve: error: argument --dispatch-policy: invalid choice: "
                                                    "'lazy' (choose from 'adaptive', 'eager', 'k', 't')"),
    (["serve"], {"OVEN_INTERCEPTION_POLICY": "lru"}, 2,
     "oven: unknown interception policy 'lru'; expected one of infercept, preserve, discard, swap"),
    (["run"], {}, 2, "oven run: error: the following arguments are required: PROGRAM"),  # ARGS is optional
    (["ps", "--drop", "x", "--programs", "--json"], {}, 2,
     "oven: --json lists: give it without --drop"),
    (["token", "remove", "bob", "--json"], {}, 2, "oven token remove: --json goes with list and add"),
    (["exports", "--drop", "x", "--json"], {}, 2, "oven: --json lists the exports: give it without --drop"),
    # prepare-model of what is no model (GGUF files say first that they convert)
    (["prepare-model", "nosuch"], {}, 1, UNKNOWN_MODEL.format("nosuch")),
    (["prepare-model", ""], {}, 1, UNKNOWN_MODEL.format("")),
    (["prepare-model", "no-config"], {}, 1, UNKNOWN_MODEL.format("no-config")),
    (["prepare-model", "missing.gguf"], {}, 1, UNKNOWN_MODEL.format("missing.gguf")),
    (["prepare-model", "dummy:foo"], {}, 1,
     "oven: unknown dummy model 'dummy:foo'; choose one of dummy:llama-3.2-1b, dummy:llama-3.2-3b, dummy:llama-3.1-8b"),
    (["prepare-model", "three-bytes.gguf"], {}, 1,
     "oven: ./three-bytes.gguf does not start with the GGUF magic bytes, so it is not a GGUF file."),
    (["prepare-model", "empty.gguf"], {}, 1, "oven: empty.gguf: cannot mmap an empty file"),
    (["prepare-model", "garbage-config"], {}, 1,
     "oven: garbage-config/config.json: not valid JSON (Expecting value: line 1 column 1 (char 0))"),
    (["prepare-model", "empty-config"], {}, 1, "oven: empty-config: model_type None is not supported (llama only)"),
    (["prepare-model", "list-config"], {}, 1, "oven: list-config/config.json: expected a JSON object"),
    (["prepare-model", "string-size"], {}, 1,
     "oven: string-size/config.json: hidden_size must be a positive integer, not '576'"),
    # numbers that must be positive, endpoints and token files that are no such thing
    *[(["generate", "hi", flag, value], {}, 2,
       f"oven generate: error: argument {flag}: invalid positive int value: '{value}'")
      for flag in ("--threads", "--num-kv-pages", "--max-new-tokens") for value in ("0", "-1")],
    (["generate", "hi", "--endpoint", "tcp://127.0.0.1:1", "--timeout", "-1"], {}, 2,
     "oven generate: error: argument --timeout: invalid positive float value: '-1'"),
    (["info", "--timeout", "-1"], {}, 2, "oven info: error: argument --timeout: invalid positive float value: '-1'"),
    (["generate", "hi", "--endpoint", "garbage"], {}, 2, BAD_ENDPOINT),
    (["info", "--endpoint", "garbage"], {}, 2, BAD_ENDPOINT),
    (["ps", "--server", "garbage", "--token", TOKEN], {}, 2, BAD_ENDPOINT),
    (["ps", "--server", "garbage", "--token", "@nonexist"], {}, 1,
     "oven: cannot read the token from nonexist: No such file or directory"),
    (["ps", "--server", "garbage", "--token", "@out"], {}, 1, "oven: cannot read the token from out: Is a directory"),
    # a file where a folder goes: said before the model loads or a build starts
    (["serve", "--model", "tiny", "--state-dir", "file"], {}, 2, "oven: state_dir file: it is a file, not a folder"),
    (["serve", "--model", "tiny", "--program-dir", "file/programs"], {}, 2,
     "oven: program_dir file/programs: file is a file, not a folder"),
    (["run", "echo"], {"OVEN_STATE_DIR": "file"}, 2, "oven: state_dir file: it is a file, not a folder"),
    (["adapters", "add", "x", "out"], {"OVEN_ADAPTER_DIR": "file"}, 2,
     "oven: adapter_dir file: it is a file, not a folder"),
    (["new", "ok2", "--dir", "file"], {}, 1, "oven: error: cannot create file/ok2: file is a file, not a folder"),
    (["build", "inferlet", "-o", "out"], {}, 1, "oven: error: cannot write the component to out: it is a folder"),
    # programs that are none
    (["upload", "empty.wasm"], {}, 2, "oven: empty.wasm: an empty file, not a component"),
    (["run", "./inferlet/app.py"], {}, 2, "oven: ./inferlet/app.py: not a .wasm component nor an inferlet folder"),
    (["upload", "./inferlet/app.py"], {}, 2, "oven: ./inferlet/app.py: not a .wasm component nor an inferlet folder"),
    (["asynclm", "--tools", "garbage"], {}, 2, BFCL_TOOLS.format("garbage")),
    (["asynclm", "--tools", "bfcl:"], {}, 2, BFCL_TOOLS.format("bfcl:")),
    (["asynclm", "--tools", "bfcl:parallel", "--sample", "999999"], {}, 2,
     "oven: --sample 999999: bfcl:parallel has samples 0 to 199"),
    (["asynclm", "--tools", "bfcl:parallel", "--sample", "-1"], {}, 2,
     "oven: --sample -1: bfcl:parallel has samples 0 to 199"),
    # an embedded server would end with the command, and a detached instance with it
    (["run", "--detach", "echo"], {}, 1, "oven: --detach needs a server that outlives this command: no server answers "
                                         "at ipc://{root}/state/control.sock (start one with `oven serve`)"),
]


@pytest.fixture(scope="module")
def mistakes(tmp_path_factory) -> Path:
    """A folder of things that are not what a verb wants."""
    root = tmp_path_factory.mktemp("mistakes")
    files = {"file": "not a folder\n", "wrong-type.toml": '[control]\nmax_instances = "x"\n',
             "not-a-table.toml": "control = 3\n", "int-for-bool.toml": "[inference]\ncpu_packed_weights = 1\n",
             "three-bytes.gguf": "abc", "empty.gguf": "", "empty.wasm": "", "inferlet/app.py": "",
             "garbage-config/config.json": "garbage{", "empty-config/config.json": "{}",
             "list-config/config.json": "[]",
             "string-size/config.json": '{"model_type": "llama", "hidden_size": "576"}'}
    for name, text in files.items():
        (root / name).parent.mkdir(exist_ok=True)
        (root / name).write_text(text)
    (root / "no-config").mkdir()
    (root / "out").mkdir()
    return root


def tree(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else None for p in sorted(root.rglob("*"))}


@pytest.mark.parametrize("argv, extra_env, status, said", MISTAKES, ids=[" ".join(m[0]) for m in MISTAKES])
def test_a_mistake_is_one_line_and_changes_nothing(mistakes, argv, extra_env, status, said):
    own = ("OVEN_CONTROL_ENDPOINT", "OVEN_CONFIG", "OVEN_TOKEN", "OVEN_ADAPTER_DIR", "OVEN_PROGRAM_DIR")
    env = {**{k: v for k, v in os.environ.items() if k not in own}, "OVEN_STATE_DIR": str(mistakes / "state"),
           "OVEN_CACHE_DIR": str(mistakes / "cache"), **extra_env}
    before = tree(mistakes)
    done = oven(*argv, cwd=mistakes, env=env, status=status, timeout_s=120)
    *first, last = done.stderr.splitlines()
    if isinstance(said, str):
        assert last == said.format(root=mistakes), done.stderr
    else:
        assert said.fullmatch(last), done.stderr
    # Before it only argparse's usage, or a GGUF file's "converting" (it is found to be none while converting).
    assert all(line.startswith(("usage:", " ", "oven: converting ")) for line in first), done.stderr
    assert "Traceback" not in done.stderr and tree(mistakes) == before


def test_a_token_file_that_cannot_be_read_is_named_and_nothing_empty_is_uploaded(home, env, server):
    for token, why in (("@nonexist", "No such file or directory"), (f"@{home}", "Is a directory")):
        done = oven("ps", "--token", token, cwd=home, env=env, status=1)
        assert done.stderr == f"oven: cannot read the token from {token[1:]}: {why}\n"
    state = Path(env["OVEN_STATE_DIR"])
    with OvenClient(env["OVEN_CONTROL_ENDPOINT"], token=(state / "operator.token").read_text()) as client:
        with pytest.raises(ValueError, match="^the program is empty$"):  # no chunk: the server would store nothing
            client.upload(b"", "nothing")
