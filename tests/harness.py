"""Running built inferlets in a real ControlLoop over a real inference process (tiny model)."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import pytest

from oven.client.paths import inferlets_dir
from oven.control.config import ControlConfig, default_program_dir
from oven.client.generate import greedy_generate
from oven.control.inference_process import start_inference_process
from oven.proto.endpoints import private_endpoint
from oven.control.runtime.loop import ControlLoop
from oven.control.tokenizer import Tokenizer
from oven.inference.config import InferenceConfig

NUM_PAGES, NUM_EMBEDS = 256, 2048
# Compiled programs persist between test runs (keyed by content hash, wasmtime version and engine
# settings), so a Python inferlet is compiled (~10 s) only the first time a run sees it.
PROGRAM_DIR = str(Path(default_program_dir()).parent / "test-programs")


def built(name: str) -> bytes:
    path = inferlets_dir() / name / f"{name}.wasm"
    if not path.is_file():
        pytest.fail(f"{path} is missing: run setup.sh, which builds the inferlets")
    return path.read_bytes()


@contextmanager
def tiny_inference(**overrides):
    config = InferenceConfig(**{**dict(model="tiny", endpoint=private_endpoint(), num_kv_pages=NUM_PAGES,
                                       num_embeds=NUM_EMBEDS, torch_threads=1), **overrides})
    with start_inference_process(config, timeout_s=120) as process:
        yield process


@contextmanager
def control_loop(inference, program_dir: str | None, programs: list[str], **overrides):
    """A ControlLoop with ``programs`` stored (in PROGRAM_DIR if ``program_dir`` is None); every event it
    emits is kept in ``loop.events``."""
    events = []
    config = ControlConfig(**{**dict(program_dir=program_dir or PROGRAM_DIR, slice_ms=1000, instance_memory_mib=192,
                                     max_kv_pages_per_instance=32), **overrides})
    loop = ControlLoop(inference.client(), config,
                       lambda inst, kind, payload: events.append((inst.instance_id, kind, payload)))
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


def direct_greedy(inference, loop, prompt: str | list[int], max_new: int) -> list[int]:
    """Greedy tokens straight from the inference process (nothing else may run meanwhile)."""
    tok = Tokenizer(loop.info.tokenizer)
    tokens = tok.encode(prompt) if isinstance(prompt, str) else prompt
    with inference.client() as client:
        return greedy_generate(client, tokens, max_new, tok.stop_token_ids, loop.info.page_size,
                               NUM_PAGES).token_ids


def assert_pools_full(loop) -> None:
    assert loop.kv_pool.num_free == NUM_PAGES
    assert loop.embed_pool.num_free == NUM_EMBEDS
    assert loop.host_pool.num_free == loop.info.num_host_pages
