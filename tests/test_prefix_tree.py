"""inferlets/prefix-tree: each leaf generates what its prompt alone would, with every shared prefix
forwarded once; ``--independent`` forwards each leaf's whole prompt (the baseline).

On SmolLM2, whose next token depends on the whole prompt (the tiny random model's hardly looks past
the token before it), so a leaf decoding over the wrong prefix or wrong K/V would show.
"""

from __future__ import annotations

import json

import pytest
from harness import assert_pools_full, direct_greedy, messages, refused, run, tiny_inference

from oven.control.tokenizer import Tokenizer

PROGRAMS = ["prefix-tree"]  # stored in the module's ControlLoop (the `loop` fixture, conftest.py)

SYSTEM = ("System: you are a patient science tutor. Explain clearly, use short sentences and one example, "
          "and say so when a question is outside biology.\n")
# A system prompt, three questions; two with follow-ups, one a leaf itself (leaves at two depths).
TREE = {"text": SYSTEM, "children": [
    {"text": "User: what is photosynthesis?\n", "children": [
        {"text": "User: explain it to a child.\nTutor:"}, {"text": "User: write its equation.\nTutor:"}]},
    {"text": "User: what is cellular respiration, and where in the cell does it happen?\n", "children": [
        {"text": "User: what does ATP do?\nTutor:"}, {"text": "User: where does the CO2 go?\nTutor:"},
        {"text": "User: is it the same in plants?\nTutor:", "children": []}]},
    {"text": "User: name one organelle.\nTutor:"}]}
LEAF_PATHS = [[0, 0], [0, 1], [1, 0], [1, 1], [1, 2], [2]]
MAX_NEW = 6


@pytest.fixture(scope="module")
def inference():
    with tiny_inference(model="smollm2-135m-instruct") as process:
        yield process


def nodes(node: dict, path: list[int] = ()) -> dict[tuple, dict]:
    """Every node of ``node``'s tree by its path of child indices."""
    found = {tuple(path): node}
    for i, child in enumerate(node.get("children", [])):
        found.update(nodes(child, [*path, i]))
    return found


def record_forwarded_tokens(loop) -> list[int]:
    """The input tokens of every forward the scheduler batches from now on (the inference process's own count)."""
    counts, form = [], loop.replicas[0].scheduler.form_batch

    def recording(*args):
        batch = form(*args)
        if batch is not None and batch.call_type == "forward_text":
            counts.extend(c.num_tokens for c in batch.commands)
        return batch
    loop.replicas[0].scheduler.form_batch = recording
    return counts


def test_leaves_equal_independent_generation_with_fewer_prefill_tokens(loop, inference):
    tok = Tokenizer(loop.info.tokenizer)
    by_path = nodes(TREE)
    node_tokens = {path: tok.encode(node["text"]) for path, node in by_path.items()}
    prompts = [[t for depth in range(len(leaf) + 1) for t in node_tokens[tuple(leaf[:depth])]] for leaf in LEAF_PATHS]
    expected = [direct_greedy(inference, loop, prompt, MAX_NEW) for prompt in prompts]
    independent_prefill = sum(map(len, prompts))
    tree_prefill = sum(map(len, node_tokens.values()))  # each node's tokens once
    assert (tree_prefill, independent_prefill) == (124, 315)  # 2.5x fewer

    forwarded = record_forwarded_tokens(loop)
    for flags, prefill in (([], tree_prefill), (["--independent"], independent_prefill)):
        forwarded.clear()
        (inst,) = run(loop, "prefix-tree", [[json.dumps(TREE), str(MAX_NEW), *flags]])
        assert inst.exit_code == 0, inst.error
        report = json.loads(messages(loop, inst)[0])
        assert [leaf["path"] for leaf in report["leaves"]] == LEAF_PATHS
        assert [leaf["tokens"] for leaf in report["leaves"]] == expected
        assert [leaf["text"] for leaf in report["leaves"]] == [tok.decode(e) for e in expected]
        assert (report["prefill_tokens"], report["independent_prefill_tokens"]) == (prefill, independent_prefill)
        # What the server forwarded: the prompts as reported, then one token per decode step after
        # each leaf's first (a leaf's last token is generated, not forwarded).
        assert sum(forwarded) == prefill + len(LEAF_PATHS) * (MAX_NEW - 1)
    assert_pools_full(loop)


def test_a_lone_root_is_one_leaf(loop, inference):
    (inst,) = run(loop, "prefix-tree", [[json.dumps({"text": SYSTEM}), "4"]])
    assert inst.exit_code == 0, inst.error
    tok = Tokenizer(loop.info.tokenizer)
    prompt = tok.encode(SYSTEM)
    greedy = direct_greedy(inference, loop, prompt, 4)
    assert json.loads(messages(loop, inst)[0]) == {
        "leaves": [{"path": [], "tokens": greedy, "text": tok.decode(greedy)}],
        "prefill_tokens": len(prompt), "independent_prefill_tokens": len(prompt)}
    assert_pools_full(loop)


def test_bad_trees_are_refused_with_the_bad_part_named(loop):
    bad = [[], ["{"], [json.dumps(TREE), "0"], [json.dumps({"text": ""})],
           [json.dumps({"text": "a", "children": [{"text": "b"}, {"txt": "c"}]})],
           [json.dumps({"text": "a", "children": {"text": "b"}})], [json.dumps(["a"])]]
    errors = ["the following arguments are required: TREE",
              "TREE is not JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
              "argument MAX_NEW_TOKENS: expected a whole number >= 1, not '0'",
              "tree.text: expected a non-empty string",
              "tree.children[1]: unknown key 'txt' (a node has \"text\" and \"children\")",
              "tree.children: expected a list of nodes",
              'tree: expected an object with "text" and "children"']
    for stderr, error in zip(refused(loop, "prefix-tree", bad), errors, strict=True):
        assert stderr.startswith("usage: prefix-tree [-h] [--independent] TREE [MAX_NEW_TOKENS]")
        assert stderr.endswith(f"prefix-tree: error: {error}\n")
    assert_pools_full(loop)
