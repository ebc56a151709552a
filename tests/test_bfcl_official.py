"""BFCL's own AST checker (bfcl_eval, as its leaderboard runs it) on calls written as oven's models write them:
every ground truth's first choices pass it, a wrong value or a missing call fails it, and it agrees with
oven's own matcher on the same calls."""

from __future__ import annotations

import pytest

from oven.client.asynclm.tools.bfcl import FILE_BY_KIND
from oven.client.asynclm.tools.bfcl_data import ground_truth_by_id, parallel_call_text
from oven.client.asynclm.tools.bfcl_official import official_verdict
from oven.client.asynclm.training.check import bfcl_calls_right


@pytest.mark.parametrize("kind", ["parallel", "live_parallel"])
def test_the_ground_truth_passes_and_a_changed_call_fails(kind):
    truths = list(ground_truth_by_id(FILE_BY_KIND[kind]).items())[:12]
    for task_id, truth in truths:
        calls = [parallel_call_text(call) for call in truth]
        assert official_verdict(kind, task_id, calls) == (True, ""), (task_id, calls)
        assert bfcl_calls_right(calls, truth)
        assert official_verdict(kind, task_id, calls[:-1])[0] is False  # a call missing
        assert not bfcl_calls_right(calls[:-1], truth)
    task_id, truth = truths[0]
    name = next(iter(truth[0]))
    wrong = [f"{name}(no_such_argument=1)"] + [parallel_call_text(call) for call in truth[1:]]
    assert official_verdict(kind, task_id, wrong)[0] is False and not bfcl_calls_right(wrong, truth)
    assert official_verdict(kind, task_id, ["not a call("]) == (False, "oven:unparsable_call")


def test_only_the_sets_bfcl_judges_by_ast():
    with pytest.raises(ValueError, match="not multi_turn"):
        official_verdict("multi_turn", "multi_turn_base_0", [])
