"""A real `oven serve` for the benches that measure the whole stack: a server in a scratch folder,
its operator client, the library's built components, and waiting for instances to exit."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from oven.client.paths import inferlets_dir
from oven.client.rpc import OvenClient

OVEN = [sys.executable, "-m", "oven.client.cli"]


class Server:
    def __init__(self, root: Path, model: str, *flags: str, endpoint: str | None = None, log: Path | None = None):
        """``flags`` come last, so they override the defaults here (``--program-dir`` say); ``log``: a file
        for the server's own log (default: dropped)."""
        self.state, self.endpoint = root / "state", endpoint or f"ipc://{root / 'control.sock'}"
        with open(log or "/dev/null", "w") as log_file:
            self.proc = subprocess.Popen([*OVEN, "serve", "--model", model, "--quiet", "--control-endpoint",
                                          self.endpoint, "--state-dir", str(self.state), "--program-dir",
                                          str(root / "programs"), *flags],
                                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log_file)
        deadline = time.monotonic() + 600
        while not self.up():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("oven serve did not come up")
            time.sleep(0.2)

    def up(self) -> bool:
        if not (self.state / "operator.token").exists():
            return False
        with self.client() as client:
            return client.reachable()

    def client(self) -> OvenClient:
        return OvenClient(self.endpoint, timeout_s=600, token=(self.state / "operator.token").read_text())

    def children(self) -> list[int]:
        """Its inference processes (its runner processes are its children too), in start order."""
        pids = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True).stdout.split()
        return sorted(int(pid) for pid in pids if b"oven.inference.server" in Path(f"/proc/{pid}/cmdline").read_bytes())

    def child(self) -> int:
        return int(subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True).stdout.split()[0])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(60)


def wasm(name: str) -> bytes:
    return (inferlets_dir() / name / f"{name}.wasm").read_bytes()


def run_to_exit(client: OvenClient, instance_ids: set[str]) -> dict[str, tuple[int, str, list[str]]]:
    """Wait for every instance: (exit code, error text, messages) each."""
    out, messages = {}, {i: [] for i in instance_ids}
    for event in client.events(poll_s=0.5):
        if event is None or event.instance_id not in instance_ids:
            continue
        if event.kind == "message":
            messages[event.instance_id].append(event.text)
        elif event.kind == "exit":
            out[event.instance_id] = (event.exit_code, event.text, messages[event.instance_id])
            if len(out) == len(instance_ids):
                return out
