"""inferlets/mcts against references computed apart from it, on the tiny model.

Every node's context is a fork: its top-B distribution and its chunk must be those of a fresh prefill
of its tokens (transformers' Llama on the very weights, no KV cache: next-token probabilities equal,
the chunk greedy after its first token, each log-probability equal). The search is then replayed here
from the nodes' values alone (UCT, SplitMix64 for the order of unvisited children, the backups): the
simulations' paths, every visit count and value sum, and the choice must be the inferlet's exactly.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from conftest import hf_reference, make_engine
from harness import assert_pools_full, messages, refused, run
from oven.control.tokenizer import Tokenizer

PROMPT = "The old lighthouse keeper climbed the stairs"
SIMULATIONS, BRANCH, CHUNK, DEPTH = 9, 2, 3, 2  # at most 2 + 4 nodes to make: terminal ones are visited again
RTOL, LOGPROB_TOL = 1e-4, 1e-4  # the tiny model's probabilities are all near 1/vocab
PROGRAMS = ["mcts"]
LOOP_CONFIG = {"max_kv_pages_per_instance": 64}
MASK64 = (1 << 64) - 1


@pytest.fixture(scope="module")
def hf():
    return hf_reference(make_engine("tiny"))  # random weights from a fixed seed: the server's too


def search(loop, seed: int, explore: float) -> dict:
    args = [PROMPT, "--simulations", str(SIMULATIONS), "--branch", str(BRANCH), "--chunk", str(CHUNK),
            "--depth", str(DEPTH), "--seed", str(seed), "--explore", str(explore)]
    (inst,) = run(loop, "mcts", [args])
    assert inst.exit_code == 0, inst.error
    (message,) = messages(loop, inst)
    return json.loads(message)


class SplitMix64:
    def __init__(self, seed: int):
        self.state = seed & MASK64

    def next_u64(self) -> int:
        self.state = z = (self.state + 0x9E3779B97F4A7C15) & MASK64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)


def replay(nodes: list[dict], seed: int, explore: float) -> tuple[list[list[int]], list[int], list[float], list[int]]:
    """The search redone from the nodes' values, top-B sizes and terminal flags: (paths, visits, value
    sums, choice); each node made must be the one the inferlet made next (its parent and index)."""
    rng, visits, sums, children, made = SplitMix64(seed), [0] * len(nodes), [0.0] * len(nodes), {}, 1
    paths = []
    for _ in range(SIMULATIONS):
        path = [0]
        while not nodes[path[-1]]["terminal"]:
            here = path[-1]
            kids = children.setdefault(here, [None] * len(nodes[here]["top"]["token_ids"]))
            unvisited = [i for i, c in enumerate(kids) if c is None]
            if unvisited:
                index = unvisited[rng.next_u64() % len(unvisited)]
                assert (nodes[made]["parent"], nodes[made]["index"]) == (here, index)
                kids[index], made = made, made + 1
                path.append(kids[index])
                break
            ucts = [sums[c] / visits[c] + explore * math.sqrt(math.log(visits[here]) / visits[c]) for c in kids]
            path.append(kids[ucts.index(max(ucts))])
        for n in path:
            visits[n] += 1
            sums[n] += nodes[path[-1]]["value"]
        paths.append(path)
    assert made == len(nodes)
    choice, here = [], 0
    while visited := [c for c in children.get(here, []) if c is not None and visits[c] > 0]:
        here = max(visited, key=lambda c: (visits[c], nodes[c]["value"], -c))
        choice.append(here)
    return paths, visits, sums, choice


def context_of(report: dict, n: int) -> list[int]:
    """The prompt and the chunks from the root down to node ``n``."""
    chunks = []
    while n:
        chunks.insert(0, report["nodes"][n]["tokens"])
        n = report["nodes"][n]["parent"]
    return report["prompt"] + sum(chunks, [])


def assert_nodes_equal_fresh_prefills(hf, report: dict, stops: frozenset[int]) -> None:
    nodes = report["nodes"]
    for n, node in enumerate(nodes):
        tokens = context_of(report, n)
        with torch.no_grad():
            logprobs = torch.log_softmax(hf(torch.tensor([tokens])).logits[0].double(), -1).numpy()
        if node["top"] is not None:  # the forked context's K/V gives a fresh prefill's distribution
            want = np.exp(logprobs[-1])
            assert node["top"]["token_ids"] == np.argsort(-want)[:BRANCH].tolist(), n
            np.testing.assert_allclose(node["top"]["probs"], want[node["top"]["token_ids"]], rtol=RTOL)
        if n == 0:
            continue
        parent, chunk = nodes[node["parent"]], node["tokens"]
        assert chunk[0] == parent["top"]["token_ids"][node["index"]] and node["depth"] == parent["depth"] + 1
        start = len(tokens) - len(chunk)  # the first chunk token's position
        for j, token in enumerate(chunk):
            row = logprobs[start + j - 1]
            assert j == 0 or token == int(np.argmax(row)), (n, j)
            assert node["logprobs"][j] == pytest.approx(row[token], abs=LOGPROB_TOL)
        assert len(chunk) == CHUNK or chunk[-1] in stops
        assert node["terminal"] == (node["depth"] == DEPTH or chunk[-1] in stops)
        assert node["value"] == sum(node["logprobs"]) / len(chunk)


@pytest.mark.parametrize("seed, explore", [(0, 1.0), (5, 0.0), (11, 4.0)])
def test_every_node_is_a_fresh_prefill_and_the_search_replays_exactly(loop, hf, seed, explore):
    report = search(loop, seed, explore)
    tok = Tokenizer(loop.info.tokenizer)
    assert report["prompt"] == tok.encode(PROMPT)
    assert_nodes_equal_fresh_prefills(hf, report, tok.stop_token_ids)
    nodes = report["nodes"]
    assert 1 + BRANCH < len(nodes) <= 1 + BRANCH + BRANCH ** 2  # the replay says exactly how many
    paths, visits, sums, choice = replay(nodes, seed, explore)
    assert report["simulations"] == paths
    assert [n["visits"] for n in nodes] == visits and visits[0] == SIMULATIONS
    assert [n["value_sum"] for n in nodes] == sums
    made = {(node["parent"], node["index"]): c for c, node in enumerate(nodes)}
    assert [n["children"] for n in nodes] == [[made[p, i] for i in range(BRANCH)] if nodes[p]["top"] else []
                                              for p in range(len(nodes))]
    assert report["choice"] == choice and len(choice) == DEPTH
    assert report["tokens"] == sum((nodes[n]["tokens"] for n in choice), [])
    assert report["text"] == tok.decode(report["tokens"])
    assert_pools_full(loop)


def test_the_same_seed_gives_the_same_search_and_the_seed_orders_it(loop):
    # two seeds whose first draw picks different root children (index = next_u64 mod 2)
    seed, other_seed = 3, next(s for s in range(4, 64) if SplitMix64(s).next_u64() % 2 != SplitMix64(3).next_u64() % 2)
    first, again, other = search(loop, seed, 1.0), search(loop, seed, 1.0), search(loop, other_seed, 1.0)
    assert first == again
    assert first["nodes"][1]["index"] != other["nodes"][1]["index"]
    assert first["simulations"] != other["simulations"]


@pytest.mark.parametrize("args, error", [
    ([], "the following arguments are required: PROMPT"),
    (["p", "--simulations", "0"], "argument --simulations: expected a whole number from 1 to 256, not '0'"),
    (["p", "--branch", "0"], "argument --branch: expected a whole number >= 1, not '0'"),
    (["p", "--explore", "-1"], "argument --explore: expected a number >= 0, not '-1'"),
    (["p", "--seed"], "argument --seed: expected one argument"),
    (["p", "--width", "2"], "unrecognized arguments: --width 2"),
])
def test_bad_arguments_are_refused(loop, args, error):
    (stderr,) = refused(loop, "mcts", [args])
    assert stderr.startswith("usage: mcts [-h] [--simulations S] [--branch B]")
    assert stderr.endswith(f"mcts: error: {error}\n")
