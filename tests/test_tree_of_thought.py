"""inferlets/tree-of-thought: the search's bookkeeping, checked against an oracle of its own.

The tiny random model proposes junk, so nothing here depends on what it proposes: every verdict
must agree with an independent check (Python's own arithmetic over a multiset of numbers), every
state must come from a valid step of a state one level up, the budget, width and beam must hold,
and hinted steps - which go through the same fork, fill and check as sampled ones - must be
accepted exactly when they are right.
"""

from __future__ import annotations

import ast
import json
import re
from collections import Counter

from harness import assert_pools_full, messages, refused, run

HINT = "2+3=5,5*4=20,20+4=24"
BASE = ["24", "2", "3", "4", "4"]


def oracle(numbers: list[int], text: str) -> tuple[str, list[int] | None]:
    """The verdict on a step "a op b = c" and the numbers left, by evaluating it with Python."""
    m = re.match(r"\s*(-?\d+\s*[-+*]\s*-?\d+)\s*=\s*(-?\d+)", text)
    if not m:
        return "parse", None
    expr = ast.parse(m[1], mode="eval").body
    a, b = ast.literal_eval(expr.left), ast.literal_eval(expr.right)
    if Counter([a, b]) - Counter(numbers):
        return "numbers", None
    if eval(compile(ast.Expression(expr), "step", "eval")) != int(m[2]):
        return "arithmetic", None
    return "ok", sorted((Counter(numbers) - Counter([a, b])).elements()) + [int(m[2])]


def check_search(report: dict, numbers: list[int], target: int, width: int, beam: int, budget: int) -> None:
    proposals = report["proposals"]
    assert len(proposals) <= budget
    assert report["counts"] == {v: sum(p["verdict"] == v for p in proposals) for v in ("ok", "parse", "numbers", "arithmetic")}
    reachable = {0: [sorted(numbers)]}  # depth -> numbers left in states a valid step reaches
    for p in proposals:
        verdict, left = oracle(p["numbers"], p["text"])
        assert p["verdict"] == verdict, p
        if left is not None:
            reachable.setdefault(p["depth"] + 1, []).append(sorted(left))
    states = Counter((p["depth"], tuple(sorted(p["numbers"]))) for p in proposals)
    for (depth, left), num_proposals in states.items():
        assert list(left) in reachable[depth] and len(left) == len(numbers) - depth
        assert num_proposals <= width
    for depth in {d for d, _ in states}:
        assert sum(1 for d, _ in states if d == depth) <= (1 if depth == 0 else beam)
    if report["solution"] is not None:  # the solution verifies, uses each number once, and its steps replay
        assert eval(report["solution"]) == target
        assert sorted(int(n) for n in re.findall(r"\d+", report["solution"])) == sorted(numbers)
        left = list(numbers)
        for step in report["steps"]:
            verdict, left = oracle(left, step)
            assert verdict == "ok"
        assert left == [target]


PROGRAMS = ["tree-of-thought"]  # stored in the module's ControlLoop (the `loop` fixture, conftest.py)


def reports(loop, args_list):
    instances = run(loop, "tree-of-thought", args_list)
    assert all(i.exit_code == 0 for i in instances), [i.error for i in instances]
    return [json.loads(m) for i in instances for m in messages(loop, i)]


def test_sampled_search_with_a_hint(loop):
    sampled, hinted, again = reports(loop, [BASE + ["--seed", "1"], BASE + ["--hint", HINT, "--seed", "1"],
                                            BASE + ["--hint", HINT, "--seed", "1"]])
    for report in (sampled, hinted):
        check_search(report, [2, 3, 4, 4], 24, width=3, beam=2, budget=24)
    assert sampled["counts"]["parse"] > 0  # the tiny model's junk is rejected
    assert hinted["solution"] == "((2 + 3) * 4) + 4"
    assert hinted["steps"] == ["2 + 3 = 5", "5 * 4 = 20", "20 + 4 = 24"]
    # hints are each level's first proposal, filled rather than sampled; the others are sampled
    assert [p["text"] for p in hinted["proposals"] if p["text"] in HINT.split(",")] == HINT.split(",")
    assert hinted["proposals"][0]["text"] == "2+3=5"
    assert again == hinted  # seeded per proposal: the same search, whatever ran beside it
    assert_pools_full(loop)


def test_budget_and_wrong_hints(loop):
    one = ["--width", "1"]
    cases = [  # (hint, budget) -> (verdicts in order, solution)
        (HINT, "3", ["ok", "ok", "ok"], "((2 + 3) * 4) + 4"),
        (HINT, "2", ["ok", "ok"], None),                        # the budget ends the search one step short
        ("2+3=6", "9", ["arithmetic"], None),
        ("2+9=11", "9", ["numbers"], None),
        ("2+3=5,5*5=25", "9", ["ok", "numbers"], None),          # one 5 left, not two
        ("two plus three", "9", ["parse"], None),
        ("2*3=6,6*4=24,24+4=28", "9", ["ok", "ok", "ok"], None),  # valid steps, wrong end: no solution
        ("3-2=1,4*4=16,1*16=16", "9", ["ok", "ok", "ok"], None),
    ]
    results = reports(loop, [BASE + one + ["--hint", hint, "--budget", budget] for hint, budget, _, _ in cases])
    for report, (hint, budget, verdicts, solution) in zip(results, cases):
        check_search(report, [2, 3, 4, 4], 24, width=1, beam=2, budget=int(budget))
        assert [p["verdict"] for p in report["proposals"]] == verdicts, hint
        assert [p["text"] for p in report["proposals"]] == hint.split(",")[:len(verdicts)]
        assert report["solution"] == solution
    assert_pools_full(loop)


def test_bad_arguments_are_refused(loop):
    cases = {("24", "x", "1"): "argument N: invalid int value: 'x'",
             ("24", "1"): "give two or more numbers N after TARGET",
             ("24", "1", "2", "--width"): "argument --width: expected one argument",
             ("24", "1", "2", "--beam", "0"): "argument --beam: expected a whole number >= 1, not '0'",
             ("24", "1", "2", "--depth", "3"): "unrecognized arguments: --depth"}
    for stderr, error in zip(refused(loop, "tree-of-thought", [list(args) for args in cases]), cases.values()):
        assert stderr.startswith("usage: tree-of-thought [-h]")
        assert stderr.endswith(f"tree-of-thought: error: {error}\n")
