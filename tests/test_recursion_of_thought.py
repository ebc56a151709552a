"""inferlets/recursion-of-thought on SmolLM2: subproblems solved side by side in forks of the root
context, recursively, give every node the tokens that solving them one after another in fresh
contexts gives (--sequential), and that greedy decoding of the node's context from scratch gives;
the answers are substituted back into the parent; the depth cap and the cap on subproblems hold."""

from __future__ import annotations

import json

from harness import assert_pools_full, direct_greedy, messages, refused, run

from oven.control.tokenizer import Tokenizer

PROGRAMS = ["recursion-of-thought"]
INFERENCE_MODEL = "smollm2-135m-instruct"
LOOP_CONFIG = dict(max_kv_pages_per_instance=128)  # up to 7 forks of a ~150-token root, pages allocated ahead
PROBLEM = "(3 + 4) * (10 - 8)"
MAX_TOKENS = 12
ASSISTANT = "<|im_start|>assistant\n"


def reports(loop, args_list: list[list[str]]) -> list[dict]:
    instances = run(loop, "recursion-of-thought", args_list)
    assert [i.exit_code for i in instances] == [0] * len(instances), [i.error for i in instances]
    return [json.loads(messages(loop, i)[0]) for i in instances]


def nodes(tree: dict) -> list[dict]:
    return [tree, *(n for sub in tree["subs"] for n in nodes(sub))]


def check_node(tok: Tokenizer, node: dict, depth_cap: int, max_subs: int) -> None:
    """The node's prompt, split and composition follow the protocol; its subproblems are its reply's
    "Sub:" lines and their answers are what came back to it."""
    cue = "Answer:" if node["forced"] else ""
    assert tok.decode(node["prompt"]) == f"<|im_start|>user\nProblem: {node['problem']}<|im_end|>\n{ASSISTANT}{cue}"
    assert node["forced"] == (node["depth"] >= depth_cap)
    reply = tok.decode([t for t in node["reply"] if t not in tok.stop_token_ids])
    lines = [line.split("Sub:", 1)[1].strip() for line in reply.split("Answer:")[0].splitlines()
             if line.strip().startswith("Sub:") and line.split("Sub:", 1)[1].strip()]
    if node["forced"] or not lines:
        assert node["subs"] == [] and node["fed"] is node["compose"] is None
        answered = reply if node["forced"] else reply.split("Answer:", 1)[-1]
        assert node["answer"] == answered.strip().split("\n")[0].strip()
        return
    assert [s["problem"] for s in node["subs"]] == lines[:max_subs]
    assert all(s["depth"] == node["depth"] + 1 for s in node["subs"])
    results = "; ".join(s["answer"] for s in node["subs"])
    assert tok.decode(node["fed"]).endswith(f"<|im_start|>user\nResults: {results}<|im_end|>\n{ASSISTANT}Answer:")
    compose = tok.decode([t for t in node["compose"] if t not in tok.stop_token_ids])
    assert node["answer"] == compose.strip().split("\n")[0].strip()


def test_forked_recursion_equals_fresh_contexts_in_sequence_and_greedy_from_scratch(loop, inference):
    args = [PROBLEM, "--depth", "2", "--max-tokens", str(MAX_TOKENS)]
    parallel, sequential = reports(loop, [args, args + ["--sequential"]])
    assert (parallel["mode"], sequential["mode"]) == ("parallel", "sequential")
    assert {**parallel, "mode": None} == {**sequential, "mode": None}
    tok, tree, root = Tokenizer(loop.info.tokenizer), parallel["tree"], parallel["root"]
    all_nodes = nodes(tree)
    assert parallel["nodes"] == len(all_nodes) and len(tree["subs"]) == 2  # the model split the root problem
    assert max(n["depth"] for n in all_nodes) == 2  # SmolLM2 splits again at depth 1: the cap stops it
    for node in all_nodes:
        check_node(tok, node, 2, 3)
    # --sequential was the fresh reference for every node; greedy from scratch, for the root and a leaf
    for node in (tree, next(n for n in all_nodes if n["forced"])):
        context = root + node["prompt"]
        assert node["reply"] == direct_greedy(inference, loop, context, MAX_TOKENS)
        if node["compose"] is not None:
            context += node["reply"] + node["fed"]
            assert node["compose"] == direct_greedy(inference, loop, context, MAX_TOKENS)
    assert parallel["answer"] == tree["answer"]
    assert_pools_full(loop)


def test_the_depth_and_subproblem_caps_hold(loop):
    args = [PROBLEM, "--max-tokens", str(MAX_TOKENS)]
    flat, shallow, narrow = reports(loop, [args + ["--depth", "0"], args + ["--depth", "1"],
                                           args + ["--depth", "1", "--subs", "1"]])
    tok = Tokenizer(loop.info.tokenizer)
    assert flat["nodes"] == 1 and flat["tree"]["forced"] and flat["tree"]["subs"] == []
    for report, max_subs in ((flat, 3), (shallow, 3), (narrow, 1)):
        for node in nodes(report["tree"]):
            check_node(tok, node, 1 if report is not flat else 0, max_subs)
            assert node["depth"] <= (0 if report is flat else 1)
    assert [s["depth"] for s in shallow["tree"]["subs"]] == [1, 1] and shallow["nodes"] == 3
    assert len(narrow["tree"]["subs"]) == 1 and narrow["nodes"] == 2  # the model wrote two; one is kept
    assert narrow["tree"]["subs"][0] == shallow["tree"]["subs"][0]
    assert_pools_full(loop)


def test_bad_arguments_are_refused(loop):
    cases = [[], ["a", "b"], ["p", "--depth", "4"], ["p", "--subs", "0"], ["p", "--max-tokens"], ["p", "--x", "1"]]
    errors = ["the following arguments are required: PROBLEM", "unrecognized arguments: b",
              "argument --depth: expected a whole number from 0 to 3, not '4'",
              "argument --subs: expected a whole number from 1 to 3, not '0'",
              "argument --max-tokens: expected one argument", "unrecognized arguments: --x 1"]
    for stderr, error in zip(refused(loop, "recursion-of-thought", cases), errors, strict=True):
        assert stderr.startswith("usage: recursion-of-thought [-h] [--depth D] [--subs S]")
        assert stderr.endswith(f"recursion-of-thought: error: {error}\n")
