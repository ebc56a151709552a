"""The Rust SDK (sdk/rust/oven) end to end: text-completion-rust over a real inference process (tiny model).

The SDK's pure parts (executor, join, samplers, page refcounts, stop conditions) have unit
tests in the crate itself (``cargo test`` in sdk/rust/oven).
"""

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

PROGRAM = "text-completion-rust"
NUM_PAGES, NUM_EMBEDS = 256, 256


@pytest.fixture(scope="module")
def inference():
    config = InferenceConfig(model="tiny", endpoint=private_endpoint(), num_kv_pages=NUM_PAGES,
                             num_embeds=NUM_EMBEDS, torch_threads=1)
    with start_inference_process(config, timeout_s=120) as process:
        yield process


@pytest.fixture(scope="module")
def loop(inference, tmp_path_factory):
    path = INFERLETS_DIR / PROGRAM / f"{PROGRAM}.wasm"
    if not path.is_file():
        pytest.fail(f"{path} is missing: run setup.sh, which builds the inferlets")
    events = []
    config = ControlConfig(program_dir=str(tmp_path_factory.mktemp("programs")), slice_ms=1000,
                           instance_memory_mib=64, max_kv_pages_per_instance=64)
    control = ControlLoop(inference.client(), config, lambda inst, kind, payload: events.append(
        (inst.instance_id, kind, payload)))
    control.events = events
    control.programs.add(path.read_bytes(), PROGRAM)
    yield control
    control.close()


@pytest.fixture(scope="module")
def tokenizer(loop):
    return Tokenizer(loop.info.tokenizer)


def run(loop, args_list: list[list[str]], timeout_s: float = 60):
    """Launch one instance per argument list at once and run them all to the end."""
    instances = [loop.launch(PROGRAM, args) for args in args_list]
    assert loop.run_until(lambda: not any(i.alive for i in instances), timeout_s)
    for inst in instances:
        assert (inst.state, inst.exit_code, inst.error) == (State.FINISHED, 0, None)
    return instances


def messages(loop, inst) -> list[str]:
    return [payload for iid, kind, payload in loop.events if iid == inst.instance_id and kind == "message"]


def direct_greedy(inference, loop, tokenizer, prompt: str, max_new: int) -> list[int]:
    with inference.client() as client:  # nothing else runs now, so the whole pool is ours
        return greedy_generate(client, tokenizer.encode(prompt), max_new, tokenizer.stop_token_ids,
                               loop.info.page_size, NUM_PAGES).token_ids


def expected_messages(tokenizer, ids: list[int]) -> list[str]:
    """The ids message, then the text without stop tokens."""
    return [" ".join(map(str, ids)), tokenizer.decode([t for t in ids if t not in tokenizer.stop_token_ids])]


def assert_pools_full(loop) -> None:
    assert loop.kv_pool.num_free == NUM_PAGES
    assert loop.embed_pool.num_free == NUM_EMBEDS


@pytest.mark.parametrize("chat", [False, True], ids=["plain", "chat"])
def test_completion_equals_direct_greedy(loop, inference, tokenizer, chat):
    prompt = "The quick brown fox"
    (inst,) = run(loop, [[prompt, "20", *(["--chat"] if chat else [])]])
    text = tokenizer.render_chat([{"role": "user", "content": prompt}], True) if chat else prompt
    expected = direct_greedy(inference, loop, tokenizer, text, 20)
    assert messages(loop, inst) == expected_messages(tokenizer, expected)
    assert_pools_full(loop)


def test_concurrent_instances_equal_their_solo_runs(loop, tokenizer):
    # 40 tokens from prompts of 3 to 20 tokens: contexts grow across page boundaries while batched.
    # The tiny model's greedy output is repetitive; seeded sampling at temperature 1 over its flat
    # distribution (top 256) is not, and would diverge on any wrong K/V.
    args_list = [[f"Sequence {i}: {'abc ' * (3 * i)}", "40", *(["--temperature=1", f"--seed={i}"] if i % 2 else [])]
                 for i in range(6)]
    solo = [messages(loop, inst) for args in args_list for inst in run(loop, [args])]
    together = run(loop, args_list)
    assert [messages(loop, inst) for inst in together] == solo
    assert all(len(m[0].split()) == 40 or int(m[0].split()[-1]) in tokenizer.stop_token_ids for m in solo)
    assert len({m[0] for m in solo[1::2]}) == 3
    assert_pools_full(loop)


# Forking flushes all but the last token: 13 of these 14 tokens (a partial page to copy), 16 of
# those 17 (full pages only, shared).
PARTIAL_PAGE_PROMPT = "Once upon a time, in a land far away, there lived a"
FULL_PAGE_PROMPT = "One two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen"


def test_greedy_forks_equal_direct_greedy(loop, inference, tokenizer):
    (inst,) = run(loop, [[PARTIAL_PAGE_PROMPT, "12", "--n=4"]])
    expected = direct_greedy(inference, loop, tokenizer, PARTIAL_PAGE_PROMPT, 12)
    assert messages(loop, inst) == expected_messages(tokenizer, expected) * 4
    assert_pools_full(loop)


@pytest.mark.parametrize("prompt", [PARTIAL_PAGE_PROMPT, FULL_PAGE_PROMPT], ids=["partial", "full"])
def test_sampled_forks_equal_solo_runs_with_their_seeds(loop, prompt):
    """Fork i samples with seed 10 + i: the same tokens as a context of its own with that seed."""
    (forked,) = run(loop, [[prompt, "24", "--n=3", "--temperature=1", "--seed=10"]])
    solo = run(loop, [[prompt, "24", "--temperature=1", f"--seed={10 + i}"] for i in range(3)])
    assert messages(loop, forked) == [m for inst in solo for m in messages(loop, inst)]
    assert len(set(messages(loop, forked)[0::2])) == 3
    assert_pools_full(loop)


def test_bad_arguments_end_with_an_error_message(loop):
    inst = loop.launch(PROGRAM, ["prompt", "--n=0"])
    assert loop.run_until(lambda: not inst.alive, 30)
    assert (inst.state, inst.exit_code) == (State.FINISHED, 1)
    assert messages(loop, inst) == ['error: bad --n "0": a positive count']
    assert_pools_full(loop)
