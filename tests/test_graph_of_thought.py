"""inferlets/graph-of-thought against references computed apart from it.

Every operation's context is rebuilt here from the documented pieces (each encoded on its own) and
the thoughts it reads; its thought must be what greedy decoding of that context from scratch in the
inference process gives (a fresh context: no forks, no shared pages). The kept thought must be the
argmax of a host-side scoring: transformers' Llama on SmolLM2's very weights gives each refined
token's log-probability (no KV cache, no server).
"""

from __future__ import annotations

import json

import pytest
import torch
from conftest import hf_reference, make_engine
from harness import assert_pools_full, direct_greedy, messages, refused, run
from oven.control.tokenizer import Tokenizer

TASK = "Give the main point of each part in a few words."
PARTS = ["Practice speaking every day with native speakers.", "Use flashcards to memorize common words.",
         "Watch films in the language with subtitles."]
K, MAX_TOKENS = len(PARTS), 8
TOLERANCE = 1e-4  # on a mean log-probability (float32 logits in the server and here; SmolLM2 is off by ~2e-5)
MODEL = "smollm2-135m-instruct"  # the tiny model's random weights write the same junk after every cue
INFERENCE_MODEL = MODEL
PROGRAMS = ["graph-of-thought"]
LOOP_CONFIG = dict(max_kv_pages_per_instance=96)


@pytest.fixture(scope="module")
def hf():
    return hf_reference(make_engine(MODEL))  # the inference process's weights


@pytest.fixture(scope="module")
def report(loop):
    (inst,) = run(loop, "graph-of-thought", [[TASK, *PARTS, "--max-tokens", str(MAX_TOKENS)]])
    assert inst.exit_code == 0, inst.error
    (message,) = messages(loop, inst)
    return json.loads(message)


def expected_contexts(tok: Tokenizer, report: dict) -> list[list[int]]:
    """Each operation's context, from the documented pieces and the thoughts it reads."""
    ops, stop = report["operations"], tok.stop_token_ids

    def body(n):
        tokens = ops[n]["tokens"]
        return tokens[:-1] if tokens and tokens[-1] in stop else tokens

    def after(n):  # operation n's context with its thought
        return ops[n]["context"] + body(n)

    prefix = tok.encode(f"Task: {TASK}\n")
    pairs = [(i, j) for i in range(K) for j in range(i + 1, K)]
    contexts = [prefix + tok.encode(f"Part {i}: {part}\nThought {i}:") for i, part in enumerate(PARTS, 1)]
    contexts += [after(i) + tok.encode(f"\nPart {j + 1}: {PARTS[j]}\nThought {j + 1}:") + body(j)
                 + tok.encode("\nCombined thought:") for i, j in pairs]
    contexts += [after(K + n) + tok.encode("\nRefined thought:") for n in range(len(pairs))]
    return contexts


def host_score(hf, context: list[int], tokens: list[int]) -> float:
    with torch.no_grad():
        logprobs = torch.log_softmax(hf(torch.tensor([context + tokens])).logits[0].double(), dim=-1)
    return sum(logprobs[len(context) - 1 + j, t].item() for j, t in enumerate(tokens)) / len(tokens)


def test_every_operation_is_greedy_decoding_of_its_context_from_scratch(loop, inference, report):
    tok = Tokenizer(loop.info.tokenizer)
    ops, num_pairs = report["operations"], K * (K - 1) // 2
    assert report["prefix"] == tok.encode(f"Task: {TASK}\n")
    assert [op["op"] for op in ops] == ["generate"] * K + ["aggregate"] * num_pairs + ["refine"] * num_pairs
    pairs = [[i, j] for i in range(K) for j in range(i + 1, K)]
    assert [op["sources"] for op in ops] == [[]] * K + pairs + [[K + n] for n in range(num_pairs)]
    assert [op["context"] for op in ops] == expected_contexts(tok, report)
    for op in ops:
        assert 1 <= len(op["tokens"]) <= MAX_TOKENS
        assert op["tokens"] == direct_greedy(inference, loop, op["context"], MAX_TOKENS), op["op"]
        assert op["text"] == tok.decode([t for t in op["tokens"] if t not in tok.stop_token_ids])
    assert len({tuple(op["tokens"]) for op in ops[:K]}) == K  # each part its own thought: the merges read two
    assert_pools_full(loop)


def test_the_kept_thought_is_the_argmax_of_the_host_scoring(hf, report):
    ops = report["operations"]
    refines = [n for n, op in enumerate(ops) if op["op"] == "refine"]
    scores = {n: host_score(hf, ops[n]["context"], ops[n]["tokens"]) for n in refines}
    for n in refines:
        assert ops[n]["score"] == pytest.approx(scores[n], abs=TOLERANCE)
    ranked = sorted(scores.values(), reverse=True)
    assert ranked[0] - ranked[1] > 2 * TOLERANCE, "the top two score within float noise: choose another question"
    assert report["best"] == max(refines, key=scores.get)
    assert report["answer"] == ops[report["best"]]["text"]


@pytest.mark.parametrize("args, error", [
    ([], "the following arguments are required: TASK, PART"),
    (["t", "a"], "give 2 to 6 PARTs"),
    (["t", *"abcdefg"], "give 2 to 6 PARTs"),
    (["t", "a", " "], "argument PART: must not be empty"),
    (["t", "a", "b", "--max-tokens", "0"], "argument --max-tokens: expected a whole number >= 1, not '0'"),
    (["t", "a", "b", "--max-tokens"], "argument --max-tokens: expected one argument"),
    (["t", "a", "b", "--k", "2"], "unrecognized arguments: --k"),  # "2" is taken as a PART
])
def test_bad_arguments_are_refused(loop, args, error):
    (stderr,) = refused(loop, "graph-of-thought", [args])
    assert stderr.startswith("usage: graph-of-thought [-h] [--max-tokens M] TASK PART [PART ...]\n")
    assert stderr.endswith(f"graph-of-thought: error: {error}\n")
