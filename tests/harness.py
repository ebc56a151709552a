"""Running built inferlets in a real ControlLoop over a real inference process (tiny model)."""

from __future__ import annotations

import hashlib
import secrets
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import wasmtime

from oven.client.build import Inferlet
from oven.client.paths import inferlets_dir
from oven.client.programs import ProgramNotFound, library_names, library_program
from oven.control.config import ControlConfig, default_program_dir
from oven.client.generate import greedy_generate
from oven.client.rpc import OvenClient
from oven.proto import control as c
from oven.control.inference_process import start_inference_process
from oven.proto.endpoints import private_endpoint
from oven.control.inference_client import InferenceClient
from oven.control.runtime.loop import ControlLoop
from oven.control.runtime.programs import DIGEST, ProgramStore, engine_config
from oven.proto.auth import private_dir, write_private_file
from oven.control.tokenizer import Tokenizer
from oven.inference.config import InferenceConfig

NUM_PAGES, NUM_EMBEDS = 256, 2048
OVEN = [sys.executable, "-m", "oven.client.cli"]
# Compiled programs persist between test runs (keyed by content hash, wasmtime version and engine
# settings), so a Python inferlet is compiled (~10 s) only the first time a run sees it.
PROGRAM_DIR = str(Path(default_program_dir()).parent / "test-programs")


def built(name: str) -> bytes:
    """A library inferlet's component; one older than its sources fails the test rather than test old code."""
    inferlet = Inferlet.at(inferlets_dir() / name)
    if not inferlet.output.is_file():
        pytest.fail(f"{inferlet.output} is missing: run setup.sh, which builds the inferlets")
    if not inferlet.up_to_date():
        pytest.fail(f"{inferlet.output} is older than its sources: run setup.sh (or `oven build inferlets/{name}`)")
    return inferlet.output.read_bytes()


def prune_program_dir() -> None:
    """Delete PROGRAM_DIR's programs but the library inferlets as built now: it keeps them between runs,
    and every older build of each (an SDK change rebuilds them all: about 1.6 GB) and every program a
    test made would otherwise stay there for good."""
    root = Path(PROGRAM_DIR)
    if not root.is_dir():
        return
    keep = set()
    for name in library_names():
        try:
            keep.add(hashlib.sha256(library_program(name).path.read_bytes()).hexdigest())
        except ProgramNotFound:  # not an inferlet, or not built
            pass
    for path in root.iterdir():
        digest = path.name.split(".", 1)[0]
        if DIGEST.match(digest) and digest not in keep:
            path.unlink(missing_ok=True)


def fresh_program(name: str) -> bytes:
    """Built program ``name`` with a custom section appended: the same code under a digest no store has."""
    body = bytes([9]) + b"oven-test" + secrets.token_bytes(16)
    return built(name) + b"\x00" + bytes([len(body)]) + body


def seed_store(folder: Path, *names: str) -> Path:
    """``folder`` made a program store holding the library programs ``names`` as PROGRAM_DIR compiled them
    (its code key, each program's .wasm and compiled files copied), as if it had compiled them itself: a
    server over it compiles none of them again (10-15 s each for a Python inferlet), while its clients
    still upload what they launch (the bytes are known: no compile)."""
    shared = ProgramStore(Path(PROGRAM_DIR), wasmtime.Engine(engine_config()))
    folder = private_dir(folder)
    write_private_file(folder / "code.key", (shared.root / "code.key").read_text())
    for name in names:
        digest = shared.add(built(name), name)
        shared.component(digest)  # compiled now, its file written, if it was not
        for path in shared.root.glob(f"{digest}.*"):
            shutil.copyfile(path, folder / path.name)
    return folder


@contextmanager
def tiny_inference(**overrides):
    config = InferenceConfig(**{**dict(model="tiny", endpoint=private_endpoint(), num_kv_pages=NUM_PAGES,
                                       num_embeds=NUM_EMBEDS, torch_threads=1), **overrides})
    with start_inference_process(config, timeout_s=120) as process:
        yield process


@contextmanager
def control_loop(inference, program_dir: str | None, programs: list[str], supervisors=None, **overrides):
    """A ControlLoop with ``programs`` stored (in PROGRAM_DIR if ``program_dir`` is None) over ``inference``
    (an inference process, or a list of processes or clients: one replica each, with ``supervisors``
    if given); every event it emits is kept in ``loop.events``."""
    events = []
    config = ControlConfig(**{**dict(program_dir=program_dir or PROGRAM_DIR, slice_ms=1000, instance_memory_mib=192,
                                     max_kv_pages_per_instance=32), **overrides})
    clients = ([i if isinstance(i, InferenceClient) else i.client() for i in inference]
               if isinstance(inference, list) else inference.client())
    loop = ControlLoop(clients, config, lambda inst, kind, payload: events.append((inst.instance_id, kind, payload)),
                       supervisors)
    loop.events = events
    for name in programs:
        loop.programs.add(built(name), name)
    try:
        yield loop
    finally:
        loop.close()


def run(loop, program: str, args_list: list[list[str]], timeout_s: float = 120):
    """Launch one instance per argument list at once, run them all to the end; return the instances."""
    instances = [loop.launch(program, args) for args in args_list]
    assert loop.run_until(lambda: not any(i.alive for i in instances), timeout_s)
    return instances


def events_of(loop, inst, kind: str) -> list[str]:
    return [payload for iid, k, payload in loop.events if iid == inst.instance_id and k == kind]


def messages(loop, inst) -> list[str]:
    return events_of(loop, inst, "message")


def refused(loop, program: str, args_list: list[list[str]]) -> list[str]:
    """Run ``program`` once per argument list; each must end as a usage error does (inferlet.ArgumentParser:
    status 2, no message sent); return what each wrote on stderr."""
    instances = run(loop, program, args_list)
    assert [(i.exit_code, i.error, messages(loop, i)) for i in instances] == [(2, None, [])] * len(instances)
    return ["".join(events_of(loop, i, "stderr")) for i in instances]


def direct_greedy(inference, loop, prompt: str | list[int], max_new: int, adapter_id: int = 0,
                  num_pages: int = NUM_PAGES) -> list[int]:
    """Greedy tokens straight from the inference process (nothing else may run meanwhile), on a LoRA
    adapter it has loaded or (0) the base model; ``loop`` may be None (the process is asked for its
    tokenizer)."""
    with inference.client() as client:
        info = loop.info if loop is not None else client.info()
        tok = Tokenizer(info.tokenizer)
        tokens = tok.encode(prompt) if isinstance(prompt, str) else prompt
        return greedy_generate(client, tokens, max_new, tok.stop_token_ids, info.page_size,
                               num_pages, adapter_id=adapter_id).token_ids


def rss_mib(pid: int) -> int:
    """Resident memory of process ``pid`` in MiB."""
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return int(status["VmRSS"].split()[0]) >> 10


def assert_pools_full(loop) -> None:
    assert loop.replicas[0].kv_pool.num_free == NUM_PAGES
    assert loop.replicas[0].embed_pool.num_free == NUM_EMBEDS
    assert loop.replicas[0].host_pool.num_free == loop.info.num_host_pages


# -- `oven serve` processes ---------------------------------------------------------------------------

class Server:
    """An `oven serve` (the tiny model unless ``model``) with its own state directory (keys, tokens) and
    program store, seeded with the library ``programs`` its tests upload (:func:`seed_store`)."""

    def __init__(self, root: Path, *flags: str, endpoint: str | None = None, model: str = "tiny",
                 programs: tuple[str, ...] = ()):
        self.root = root
        if programs:
            seed_store(root / "programs", *programs)
        self.state = root / "state"
        self.endpoint = endpoint or f"ipc://{root / 'control.sock'}"
        self.proc = subprocess.Popen(
            [*OVEN, "serve", "--model", model, "--quiet", "--control-endpoint", self.endpoint, "--state-dir",
             str(self.state), "--program-dir", str(root / "programs"), "--num-kv-pages", "256", *flags],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 300
        while not (self.state / "operator.token").exists() or not self.reachable():
            assert self.proc.poll() is None, self.proc.stderr.read()
            assert time.monotonic() < deadline, "oven serve did not come up"
            time.sleep(0.1)

    @property
    def operator_token(self) -> str:
        return (self.state / "operator.token").read_text().strip()

    def reachable(self) -> bool:
        with OvenClient(self.endpoint, token=self.operator_token) as client:
            return client.reachable()

    def client(self, token: str | None = None, timeout_s: float = 60) -> OvenClient:
        return OvenClient(self.endpoint, timeout_s, token=token or self.operator_token)

    def children(self, module: str = "oven.inference.server") -> list[int]:
        """Its child processes running ``python -m module`` (its inference process; its runners are
        ``oven.control.runner``)."""
        pids = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True).stdout.split()
        return [int(pid) for pid in pids if _cmdline(int(pid))[2:3] == [module]]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode().split("\0")
    except OSError:  # gone meanwhile
        return []


def oven(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*OVEN, *args], capture_output=True, text=True, timeout=timeout_s)


def wait_exit(client: OvenClient, instance_id: str, timeout_s: float = 60) -> c.InstanceEvent:
    deadline = time.monotonic() + timeout_s
    for event in client.events(poll_s=0.2):
        assert time.monotonic() < deadline, f"{instance_id} did not exit"
        if event is not None and event.instance_id == instance_id and event.kind == "exit":
            return event
