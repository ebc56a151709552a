"""BFCL's own verdict on a sample's calls: ``bfcl_eval``'s AST checker, as its leaderboard runs it.

oven's matcher (``training.check.bfcl_calls_right``) judges calls against BFCL's possible answers in
its own code; this module asks the checker that ships in the ``bfcl-eval`` wheel instead, so a table
can carry the official verdict beside oven's. The calls are parsed by oven's call parser (BFCL's
decoder imports its Java and JavaScript parsers, which need ``tree_sitter``, not installed), into the
form the checker takes: ``[{name: {argument: value}}]``.

The checker looks the model up in BFCL's model table to learn whether the model's function names had
their dots replaced by underscores; importing that table imports every provider's SDK (the wheel is
installed without its dependencies, bfcl_data.py). oven's model keeps dots, so the checker is given a
table with that one entry, and nothing else of BFCL's is replaced.
"""

from __future__ import annotations

import sys
import types
from functools import cache

from .bfcl import FILE_BY_KIND
from .bfcl_data import ground_truth_by_id, read_entries
from .call import ToolError, parse_call

MODEL_NAME = "oven"
KINDS = ("parallel", "live_parallel")  # the sets whose answers BFCL judges by AST


@cache
def _checker():
    from bfcl_eval.constants.enums import Language

    if "bfcl_eval.constants.model_config" not in sys.modules:
        from dataclasses import dataclass

        @dataclass
        class ModelConfig:  # the one field the AST checker reads
            underscore_to_dot: bool = False

        table = types.ModuleType("bfcl_eval.constants.model_config")
        table.MODEL_CONFIG_MAPPING = {MODEL_NAME: ModelConfig()}
        sys.modules[table.__name__] = table
    from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker
    return ast_checker, Language.PYTHON


@cache
def _functions(kind: str) -> dict[str, list]:
    return {entry["id"]: entry["function"] for entry in read_entries(FILE_BY_KIND[kind])}


def official_verdict(kind: str, task_id: str, calls: list[str]) -> tuple[bool, str]:
    """(valid, BFCL's error type or "") for ``calls`` made on the ``kind`` sample ``task_id``."""
    if kind not in KINDS:
        raise ValueError(f"BFCL judges {', '.join(KINDS)} by AST, not {kind}")
    try:
        parsed = [parse_call(call) for call in calls]
    except ToolError:
        return False, "oven:unparsable_call"
    if any(call.args for call in parsed):  # BFCL's format has keyword arguments only
        return False, "oven:positional_argument"
    checker, python = _checker()
    verdict = checker(_functions(kind)[task_id], [{call.name: call.kwargs} for call in parsed],
                      ground_truth_by_id(FILE_BY_KIND[kind])[task_id], python, kind, MODEL_NAME)
    return bool(verdict["valid"]), verdict.get("error_type", "")
