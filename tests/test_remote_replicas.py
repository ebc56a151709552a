"""Inference replicas on other hosts (control/remote.py; `oven inference --join`, `oven serve --remote-replicas`),
tested over loopback tcp with separate processes standing for the hosts."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import time

import pytest
from harness import OVEN, built, control_loop, direct_greedy, messages, run
from oven.control.remote import RemoteInference, parse_remote_replicas
from oven.control.runtime.instance import State

PROMPTS = [f"Remote test {i}: {'a b c ' * i}" for i in range(4)]
NEW = 10


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RemoteHost:
    """`oven inference --join KEYFILE` on a tcp endpoint: the process another host would run."""

    def __init__(self, keyfile, port: int):
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.proc = subprocess.Popen([*OVEN, "inference", "--model", "tiny", "--endpoint", self.endpoint, "--join",
                                      str(keyfile), "--num-kv-pages", "256", "--num-embeds", "64", "--torch-threads",
                                      "1", "--quiet"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.token = self.proc.stdout.readline().strip()  # printed once its keys are set, before the model loads
        assert self.token.startswith("oven-"), self.proc.stderr.read()

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def keyfile(tmp_path):
    return tmp_path / "inference.keys"


def test_a_remote_replica_serves_beside_a_local_one_and_a_lost_one_ends_only_its_instances(
        inference, keyfile, tmp_path):
    port = free_port()
    host = RemoteHost(keyfile, port)
    try:
        ((endpoint, token),) = parse_remote_replicas(f"{host.endpoint}=@{_write(tmp_path / 'token', host.token)}")
        remote = RemoteInference(endpoint, token, timeout_s=120)  # (the tiny model loads meanwhile)
        with control_loop([inference, remote.client()], None, ["hello-python", "text-completion"],
                          supervisors=[None, remote]) as loop:
            instances = run(loop, "hello-python", [[prompt, str(NEW)] for prompt in PROMPTS])
            assert [inst.replica.index for inst in instances] == [0, 1, 0, 1]
            want = {p: " ".join(map(str, direct_greedy(inference, None, p, NEW))) for p in PROMPTS}
            assert [messages(loop, inst) for inst in instances] == [[want[p]] for p in PROMPTS]

            paused = [loop.launch("text-completion", [p, str(NEW), "--pause", "60000"]) for p in PROMPTS[:2]]
            assert loop.run_until(lambda: all(inst.io_idle for inst in paused), 60)
            host.proc.send_signal(signal.SIGKILL)
            near, far = paused
            assert loop.run_until(lambda: not far.alive, 30)
            assert (far.state, far.error) == (State.KILLED, f"inference replica 1 died: the connection to "
                                                            f"{host.endpoint} dropped (its process or host is gone)")
            loop.deliver(near.instance_id, "an answer")
            assert loop.run_until(lambda: not near.alive, 60) and near.exit_code == 0
            assert messages(loop, near)[-1] == want[PROMPTS[0]]

            host = RemoteHost(keyfile, port)  # the same keys: this side is admitted again
            assert host.token == str(token)
            assert loop.run_until(lambda: loop.replicas[1].serving, 120)
            again = run(loop, "hello-python", [[p, str(NEW)] for p in PROMPTS[:2]])
            assert sorted(inst.replica.index for inst in again) == [0, 1]
            assert [messages(loop, inst) for inst in again] == [[want[p]] for p in PROMPTS[:2]]
    finally:
        host.stop()


def _write(path, text: str):
    path.write_text(text)
    return path


def test_an_unreachable_remote_host_is_a_clear_error_at_start(tmp_path, keyfile):
    token = "oven-" + "ab" * 32 + "-" + "cd" * 32
    started = time.monotonic()
    done = subprocess.run([*OVEN, "serve", "--data-parallel", "0", "--remote-replicas",
                           f"tcp://127.0.0.1:{free_port()}={token}", "--state-dir", str(tmp_path / "state"),
                           "--control-endpoint", f"ipc://{tmp_path / 'control.sock'}", "--quiet"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert re.search(r"^oven: no inference process answers at tcp://127\.0\.0\.1:\d+ within 5 s \(is `oven inference "
                     r"--join` running there, and is this its token\?\)$", done.stderr, re.M), done.stderr
    assert "Traceback" not in done.stderr and time.monotonic() - started < 60


@pytest.mark.parametrize("text, error", [
    ("tcp://h:1", "remote replica 'tcp://h:1': expected tcp://HOST:PORT=TOKEN"),
    ("ipc:///x=oven-1", "remote replica 'ipc:///x': expected tcp://HOST:PORT=TOKEN"),
    ("tcp://h:1=nonsense", "remote replica tcp://h:1: not an oven token"),
    ("tcp://h:1=@/nonexistent/token", "remote replica tcp://h:1: cannot read its token: No such file or directory"),
])
def test_bad_remote_replica_settings_say_what_is_wrong(text, error):
    with pytest.raises(ValueError, match=re.escape(error)):
        parse_remote_replicas(text)
