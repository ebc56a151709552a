"""The Rust SDK (sdk/rust/oven) end to end: text-completion-rust over a real inference process (tiny model).

The SDK's pure parts (executor, join, samplers, page refcounts, stop conditions) have unit tests
in the crate itself (``cargo test`` in sdk/rust/oven).
"""

from __future__ import annotations

import pytest
from harness import (
    assert_pools_full,
    direct_greedy,
    messages,
    run,
)
from oven.control.runtime.instance import State
from oven.control.tokenizer import Tokenizer

PROGRAM = "text-completion-rust"
# Forking flushes all but the last token: 13 of these 14 tokens (a partial page to copy), and 16 of
# those 17 (full pages only, shared).
PARTIAL_PAGE_PROMPT = "Once upon a time, in a land far away, there lived a"
FULL_PAGE_PROMPT = "One two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen"


PROGRAMS = [PROGRAM]  # stored in the module's ControlLoop (the `loop` fixture, conftest.py)


@pytest.fixture(scope="module")
def tokenizer(loop):
    return Tokenizer(loop.info.tokenizer)


def completions(loop, args_list: list[list[str]]) -> list[list[str]]:
    """Run one instance per argument list at once; the messages of each (all must succeed)."""
    instances = run(loop, PROGRAM, args_list, timeout_s=60)
    for inst in instances:
        assert (inst.state, inst.exit_code, inst.error) == (State.FINISHED, 0, None)
    return [messages(loop, inst) for inst in instances]


def expected_messages(tokenizer, ids: list[int]) -> list[str]:
    """The ids message, then the text without end tokens."""
    return [" ".join(map(str, ids)), tokenizer.decode([t for t in ids if t not in tokenizer.stop_token_ids])]


@pytest.mark.parametrize("chat", [False, True], ids=["plain", "chat"])
def test_completion_equals_direct_greedy(loop, inference, tokenizer, chat):
    prompt = "The quick brown fox"
    (got,) = completions(loop, [[prompt, "20", *(["--chat"] if chat else [])]])
    text = tokenizer.render_chat([{"role": "user", "content": prompt}], True) if chat else prompt
    assert got == expected_messages(tokenizer, direct_greedy(inference, loop, text, 20))
    assert_pools_full(loop)


def test_concurrent_instances_equal_their_solo_runs(loop, tokenizer):
    # 32 tokens after prompts of 3 to 20 tokens: contexts grow across page boundaries while batched.
    # The tiny model's greedy output is repetitive; seeded sampling at temperature 1 over its flat
    # distribution (top 256) is not, and would diverge on any wrong K/V.
    args_list = [[f"Sequence {i}: {'abc ' * (3 * i)}", "32", *(["--temperature", "1", "--seed", str(i)] if i % 2 else [])]
                 for i in range(6)]
    solo = [completions(loop, [args])[0] for args in args_list]
    assert completions(loop, args_list) == solo
    assert all(len(m[0].split()) == 32 or int(m[0].split()[-1]) in tokenizer.stop_token_ids for m in solo)
    assert len({m[0] for m in solo[1::2]}) == 3
    assert_pools_full(loop)


def test_greedy_forks_equal_direct_greedy(loop, inference, tokenizer):
    (got,) = completions(loop, [[PARTIAL_PAGE_PROMPT, "12", "--n", "4"]])
    assert got == expected_messages(tokenizer, direct_greedy(inference, loop, PARTIAL_PAGE_PROMPT, 12)) * 4
    assert_pools_full(loop)


@pytest.mark.parametrize("prompt", [PARTIAL_PAGE_PROMPT, FULL_PAGE_PROMPT], ids=["partial", "full"])
def test_sampled_forks_equal_solo_runs_with_their_seeds(loop, prompt):
    """Fork i samples with seed 10 + i: the same tokens as a context of its own with that seed."""
    (forked,) = completions(loop, [[prompt, "24", "--n", "3", "--temperature", "1", "--seed", "10"]])
    solo = completions(loop, [[prompt, "24", "--temperature", "1", "--seed", str(10 + i)] for i in range(3)])
    assert forked == [m for messages_of_one in solo for m in messages_of_one]
    assert len(set(forked[0::2])) == 3
    assert_pools_full(loop)


@pytest.mark.parametrize("flag", ["--offload", "--evict"])
def test_offloaded_or_evicted_prompt_continues_as_direct_greedy(loop, inference, tokenizer, flag):
    """Offload and restore (or evict, then re-prefill) between prefill and decoding changes nothing."""
    (got,) = completions(loop, [[PARTIAL_PAGE_PROMPT, "12", flag]])
    assert got == expected_messages(tokenizer, direct_greedy(inference, loop, PARTIAL_PAGE_PROMPT, 12))
    assert_pools_full(loop)


def test_imports_of_an_export_equal_direct_runs(loop, inference, tokenizer):
    """The exporter generates on after exporting the prompt's pages (13 tokens: a partial page, which
    its writes must copy first); then three importers decode concurrently from those pages (their
    writes into the shared partial page copied first too): greedy, and sampled with two seeds, each
    the same as a run of its own without the export."""
    greedy = expected_messages(tokenizer, direct_greedy(inference, loop, PARTIAL_PAGE_PROMPT, 12))
    assert completions(loop, [[PARTIAL_PAGE_PROMPT, "12", "--export", "story"]]) == [greedy]
    sampled = [[PARTIAL_PAGE_PROMPT, "24", "--temperature", "1", "--seed", str(seed)] for seed in (3, 4)]
    imported = completions(loop, [[PARTIAL_PAGE_PROMPT, "12", "--import", "story"],
                                  *[[*args, "--import", "story"] for args in sampled]])
    assert imported == [greedy, *completions(loop, sampled)]
    assert imported[1] != imported[2]
    loop.drop_export("story")
    assert_pools_full(loop)


def test_main_returning_err_fails_with_its_message(loop):
    """As a Python inferlet's exception: the instance fails, its message the reason (oven ps, oven run)."""
    (inst,) = run(loop, PROGRAM, [["prompt", "--n", "0"]], timeout_s=30)
    assert (inst.state, inst.exit_code, inst.error) == (State.FAILED, 1, "--n must be at least 1")
    assert messages(loop, inst) == ["error: --n must be at least 1"]
    assert_pools_full(loop)
