"""Inferlets in wasmtime over a real inference process (tiny model): results, batching, isolation."""

from __future__ import annotations

import pytest

from oven.control.commands import INFERLETS_DIR
from oven.control.config import ControlConfig
from oven.control.generate import greedy_generate
from oven.control.inference_process import private_endpoint, start_inference_process
from oven.control.runtime.instance import State
from oven.control.runtime.loop import ControlLoop
from oven.control.tokenizer import Tokenizer
from oven.inference.config import InferenceConfig

NUM_PAGES, NUM_EMBEDS = 256, 2048


def built(name: str) -> bytes:
    path = INFERLETS_DIR / name / f"{name}.wasm"
    if not path.is_file():
        pytest.fail(f"{path} is missing: run setup.sh, which builds the inferlets")
    return path.read_bytes()


@pytest.fixture(scope="module")
def inference():
    config = InferenceConfig(model="tiny", endpoint=private_endpoint(), num_kv_pages=NUM_PAGES,
                             num_embeds=NUM_EMBEDS, torch_threads=1)
    with start_inference_process(config, timeout_s=120) as process:
        yield process


@pytest.fixture(scope="module")
def loop(inference, tmp_path_factory):
    events = []
    config = ControlConfig(program_dir=str(tmp_path_factory.mktemp("programs")), slice_ms=1000,
                           instance_memory_mib=192, max_kv_pages_per_instance=32)
    control = ControlLoop(inference.client(), config, lambda inst, kind, payload: events.append(
        (inst.instance_id, kind, payload)))
    control.events = events
    for name in ("hello-python", "hello-rust", "hostile"):
        control.programs.add(built(name), name)
    yield control
    control.close()


def run(loop, program: str, args_list: list[list[str]], timeout_s: float = 120):
    """Launch one instance per argument list at once, run them all to the end; return the instances."""
    instances = [loop.launch(program, args) for args in args_list]
    assert loop.run_until(lambda: not any(i.alive for i in instances), timeout_s)
    return instances


def messages(loop, inst) -> list[str]:
    return [payload for iid, kind, payload in loop.events if iid == inst.instance_id and kind == "message"]


def direct_greedy(inference, loop, prompt: str, max_new: int) -> list[int]:
    tok = Tokenizer(loop.info.tokenizer)
    with inference.client() as client:  # nothing else runs now, so the whole pool is ours
        return greedy_generate(client, tok.encode(prompt), max_new, tok.stop_token_ids, loop.info.page_size,
                               NUM_PAGES).token_ids


def assert_pools_full(loop) -> None:
    assert loop.kv_pool.num_free == NUM_PAGES
    assert loop.embed_pool.num_free == NUM_EMBEDS
    assert loop.host_pool.num_free == loop.info.num_host_pages


@pytest.mark.parametrize("program", ["hello-python", "hello-rust"])
@pytest.mark.parametrize("flags", [[], ["--fused"]], ids=["three-calls", "forward-text"])
def test_raw_api_inferlets_equal_direct_greedy(loop, inference, program, flags):
    (inst,) = run(loop, program, [["The quick brown fox", "10", *flags]])
    assert (inst.state, inst.exit_code) == (State.FINISHED, 0)
    expected = direct_greedy(inference, loop, "The quick brown fox", 10)
    assert messages(loop, inst) == [" ".join(map(str, expected))]
    assert_pools_full(loop)


def test_64_concurrent_inferlets_match_solo_runs_and_batch(loop, inference):
    prompts = [f"Sequence {i}: {'abc ' * (i % 7)}" for i in range(64)]
    before = loop.scheduler.stats()
    instances = run(loop, "hello-python", [[prompt, "6"] for prompt in prompts])
    after = loop.scheduler.stats()
    assert all(i.exit_code == 0 for i in instances)
    for inst, prompt in zip(instances, prompts):
        assert messages(loop, inst) == [" ".join(map(str, direct_greedy(inference, loop, prompt, 6)))]
    assert after.num_horizontal_batches > before.num_horizontal_batches
    assert after.num_vertical_batches > before.num_vertical_batches
    batches = after.num_batches - before.num_batches
    assert batches < (after.num_commands - before.num_commands) / 4  # real batching, not one call per batch
    assert_pools_full(loop)


@pytest.mark.parametrize("mode, fragment", [
    ("forged", "never allocated here"),
    ("double-free", "already freed"),
    ("use-after-free", "already freed"),
    ("quota", "quota exceeded"),
])
def test_bad_handles_get_errors(loop, mode, fragment):
    (inst,) = run(loop, "hostile", [[mode]])
    assert (inst.state, inst.exit_code) == (State.FINISHED, 3)
    (message,) = messages(loop, inst)
    assert message.startswith("error: ") and fragment in message
    assert_pools_full(loop)


@pytest.mark.parametrize("mode, fragment", [
    ("spin", "wasm trap: interrupt"),
    ("memory", "wasm trap"),
    ("trap", "runtimeerror: hostile inferlet gave up"),
])
def test_hostile_instances_die_alone(loop, inference, mode, fragment):
    """A spinning, memory-hungry or crashing inferlet is killed while a well-behaved one finishes."""
    hostile = loop.launch("hostile", [mode])
    (good,) = run(loop, "hello-python", [["Still fine", "5"]])
    assert loop.run_until(lambda: not hostile.alive, 60)
    assert hostile.state is State.KILLED and hostile.exit_code == 1
    assert fragment in hostile.error.lower()
    assert good.exit_code == 0
    assert messages(loop, good) == [" ".join(map(str, direct_greedy(inference, loop, "Still fine", 5)))]
    assert_pools_full(loop)
