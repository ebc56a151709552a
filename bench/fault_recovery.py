"""How fast `oven serve` notices and recovers from process faults, and how many instances it serves
authenticated (issue 12's goals), measured on real processes.

* ``kill -9`` of the inference process while an instance decodes: seconds until that instance's
  exit event (``inference process died: ...``) reaches its client, and until a new ``hello-python``
  run completes on the restarted process (its tokens checked against a run before the fault);
* ``kill -9`` of the control process: seconds until its inference child is gone;
* ``oven serve`` on an endpoint another server listens on: seconds until it exits, and that it
  never started a model;
* a short ``hello-python`` run while another client uploads a Python program the server has not
  seen (compiled on the server's worker thread): its time against the same run alone;
* ``--instances N`` concurrent ``text-completion`` runs of ``--tokens`` tokens each, launched over
  one authenticated client: all outputs equal to one run alone, and the wall time.

Run: ``.venv/bin/python bench/fault_recovery.py [--model smollm2-135m-instruct] [--instances 512]``
(writes ``results/fault_recovery.md``).
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import RESULTS_DIR, machine_lines  # noqa: E402
from served import OVEN, Server, run_to_exit, wasm  # noqa: E402

def inference_kill(root: Path, model: str) -> list[str]:
    srv = Server(root, model)
    try:
        with srv.client() as client:
            hello = client.upload(wasm("hello-python"))
            (before,) = run_to_exit(client, {client.launch(hello, ["Once upon a time", "8"])}).values()
            long_run = client.launch(client.upload(wasm("text-completion")), ["Once upon a time", "100000"])
            time.sleep(2.0)  # decoding by now
            child = srv.child()
            killed = time.monotonic()
            os.kill(child, signal.SIGKILL)
            (code, error, _), = run_to_exit(client, {long_run}).values()
            ended = time.monotonic() - killed
            (after,) = run_to_exit(client, {client.launch(hello, ["Once upon a time", "8"])}).values()
            served = time.monotonic() - killed
    finally:
        srv.stop()
    return [f"| kill -9 of the inference process: the decoding instance's exit reaches its client | {ended:.2f} s "
            f"| exit {code}: `{error}` |",
            f"| ... and a new `hello-python` run completes on the restarted process | {served:.2f} s "
            f"| tokens {'equal to' if after[2] == before[2] else 'DIFFERENT from'} a run before the fault |"]


def replica_kill(root: Path, model: str) -> list[str]:
    """``--data-parallel 2``: one long run on each replica; kill -9 of replica 1's process."""
    srv = Server(root, model, "--data-parallel", "2")
    try:
        with srv.client() as client:
            hello, completion = client.upload(wasm("hello-python")), client.upload(wasm("text-completion"))
            (before,) = run_to_exit(client, {client.launch(hello, ["Once upon a time", "8"])}).values()
            runs = [client.launch(completion, ["Once upon a time", "100000"]) for _ in range(2)]
            time.sleep(2.0)  # decoding by now
            replica = {i.instance_id: i.replica for i in client.instances()}
            (lost,) = [i for i in runs if replica[i] == 1]
            children = srv.children()  # in replica order
            killed = time.monotonic()
            os.kill(children[1], signal.SIGKILL)
            (code, error, _), = run_to_exit(client, {lost}).values()
            ended = time.monotonic() - killed
            survivor_alive = any(i.instance_id in runs and i.instance_id != lost and i.state in ("ready", "waiting")
                                 for i in client.instances())
            while any(not r.serving for r in client.stats().replicas):
                time.sleep(0.05)
            back = time.monotonic() - killed
            new = {client.launch(hello, ["Once upon a time", "8"]) for _ in range(2)}
            on = sorted(i.replica for i in client.instances() if i.instance_id in new)
            same = all(run[2] == before[2] for run in run_to_exit(client, new).values())
    finally:
        srv.stop()
    return [f"| `--data-parallel 2`, kill -9 of replica 1 while each replica decodes a run: the run there ends for "
            f"its client | {ended:.2f} s | exit {code}: `{error}`; the run on replica 0 "
            f"{'still decodes' if survivor_alive else 'ENDED TOO'} |",
            f"| ... and replica 1's new process serves | {back:.2f} s | two new `hello-python` runs (on replicas "
            f"{' and '.join(map(str, on))}): tokens {'equal to' if same else 'DIFFERENT from'} a run before the fault |"]


def control_kill(root: Path, model: str) -> list[str]:
    srv = Server(root, model)
    child = srv.child()
    killed = time.monotonic()
    srv.proc.kill()
    srv.proc.wait()
    while Path(f"/proc/{child}").exists() and Path(f"/proc/{child}/stat").read_text().split()[2] != "Z":
        time.sleep(0.01)
    return [f"| kill -9 of the control process: its inference child is gone | {time.monotonic() - killed:.2f} s | |"]


def occupied(root: Path, model: str) -> list[str]:
    srv = Server(root / "first", model)
    try:
        started = time.monotonic()
        done = subprocess.run([*OVEN, "serve", "--model", model, "--control-endpoint", srv.endpoint, "--state-dir",
                               str(root / "second")], capture_output=True, text=True, timeout=600)
        took = time.monotonic() - started
    finally:
        srv.stop()
    loaded = "starting the inference process" in done.stderr
    return [f"| `oven serve` on an endpoint in use exits (status {done.returncode}) | {took:.2f} s "
            f"| {'loaded a model first' if loaded else 'no model loaded'}: `{done.stderr.strip()}` |"]


def compile_beside(root: Path, model: str, reps: int = 3) -> list[str]:
    srv = Server(root, model)
    try:
        with srv.client() as client:
            hello = client.upload(wasm("hello-python"))

            def run() -> float:
                started = time.monotonic()
                run_to_exit(client, {client.launch(hello, ["Once upon a time", "8"])})
                return time.monotonic() - started

            def upload(program: bytes) -> None:  # by another client, on a thread of its own
                with srv.client() as other:
                    started = time.monotonic()
                    other.upload(program)
                    uploads.append(time.monotonic() - started)

            run()  # warm
            alone, beside, uploads = [run() for _ in range(reps)], [], []
            echo = wasm("echo")
            for _ in range(reps):
                section = bytes([9]) + b"oven-test" + secrets.token_bytes(16)  # a custom section: a new digest
                uploader = threading.Thread(target=upload, args=(echo + b"\x00" + bytes([len(section)]) + section,))
                uploader.start()
                time.sleep(1.0)  # its chunks are in by now: the server compiles
                beside.append(run())
                uploader.join()
    finally:
        srv.stop()
    a, b = statistics.median(alone), statistics.median(beside)
    return [f"| a `hello-python` run of 8 tokens while another client uploads a new Python program "
            f"| {b:.2f} s (alone {a:.2f} s, {b / a:.1f}x) | median of {reps}; the uploads took "
            f"{statistics.median(uploads):.1f} s (the compile) |"]


def load(root: Path, model: str, instances: int, tokens: int) -> list[str]:
    srv = Server(root, model, "--max-instances", str(max(1024, instances)))
    try:
        with srv.client() as client:
            program = client.upload(wasm("text-completion"))
            (alone,) = run_to_exit(client, {client.launch(program, ["Once upon a time", str(tokens)])}).values()
            started = time.monotonic()
            ids = {client.launch(program, ["Once upon a time", str(tokens)]) for _ in range(instances)}
            results = run_to_exit(client, ids)
            took = time.monotonic() - started
            stats = client.stats()
    finally:
        srv.stop()
    correct = sum(1 for code, _, messages in results.values() if code == 0 and messages == alone[2])
    return [f"| {instances} concurrent `text-completion` x {tokens} tokens, one authenticated client | {took:.1f} s "
            f"| {correct} of {instances} equal to a run alone; mean batch {stats.mean_batch_size:.1f} items |"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--instances", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=4)
    steps = ["inference_kill", "replica_kill", "control_kill", "occupied", "compile_beside", "load"]
    parser.add_argument("--steps", nargs="+", default=steps, choices=steps, help="which to measure (default: all)")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="oven-faults-") as tmp:
        root = Path(tmp)
        for i, step in enumerate((inference_kill, replica_kill, control_kill, occupied, compile_beside, load)):
            if step.__name__ in args.steps:
                rows += step(root / str(i), args.model, *((args.instances, args.tokens) if step is load else ()))
                print(rows[-1], flush=True)
    table = "\n".join([f"# Fault recovery and authenticated load ({args.model})", "", *machine_lines(),
                       time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "",
                       "| what | measured | outcome |", "|---|---|---|", *rows, ""])
    RESULTS_DIR.mkdir(exist_ok=True)
    (RESULTS_DIR / "fault_recovery.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
