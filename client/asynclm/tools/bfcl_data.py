"""Reading the BFCL data and tool classes shipped in the ``bfcl-eval`` wheel.

Only data files and the multi-turn tool classes are used. The wheel is installed
with ``--no-deps`` (setup.sh): its evaluation harness needs dozens of packages
(model SDKs, sentence-transformers, faiss), but the data are plain JSON lines and
the eight multi-turn classes import only the standard library and ``mpmath``
(MathAPI), which torch already brings in through sympy. The memory and web-search
classes, which need faiss, sentence-transformers or network access, are never
imported.
"""

from __future__ import annotations

import copy
import importlib
import json

from functools import cache
from importlib import resources
from typing import Any

from .call import format_call

__all__ = [
    "MULTI_TURN_CLASSES",
    "class_instance",
    "data_file",
    "func_docs",
    "ground_truth_by_id",
    "parallel_call_text",
    "question_text",
    "read_entries",
]

BFCL_REQUIREMENT = "bfcl-eval==2026.3.23"

# The tool classes of BFCL's multi-turn categories (the others are agentic/memory ones).
MULTI_TURN_CLASSES = (
    "GorillaFileSystem", "MathAPI", "MessageAPI", "TwitterAPI", "TicketAPI",
    "TradingBot", "TravelAPI", "VehicleControlAPI",
)


def data_file(relative_path: str) -> Any:
    """The wheel's ``bfcl_eval/data/<relative_path>`` as a readable resource.

    Raises :class:`ModuleNotFoundError` naming the requirement if the wheel is missing.
    """
    try:
        return resources.files("bfcl_eval") / "data" / relative_path
    except ModuleNotFoundError:
        raise ModuleNotFoundError(
            f"BFCL workloads need {BFCL_REQUIREMENT} (pip install --no-deps {BFCL_REQUIREMENT})"
        ) from None


@cache
def read_entries(relative_path: str) -> tuple[dict, ...]:
    """The JSON-lines file's entries, in file order (cached: the files do not change)."""
    with data_file(relative_path).open(encoding="utf-8") as f:
        return tuple(json.loads(line) for line in f if line.strip())


def ground_truth_by_id(file_name: str) -> dict[str, list]:
    """``possible_answer/<file_name>``: each entry's ``ground_truth`` by entry id."""
    entries = read_entries(f"possible_answer/{file_name}")
    return {entry["id"]: entry["ground_truth"] for entry in entries}


def func_docs(class_name: str) -> tuple[dict, ...]:
    """The JSON-schema function definitions of a multi-turn tool class."""
    from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING

    return read_entries(f"multi_turn_func_doc/{MULTI_TURN_FUNC_DOC_FILE_MAPPING[class_name]}")


def class_instance(class_name: str, initial_config: dict) -> object:
    """A fresh instance of BFCL's tool class, in the state the sample starts from
    (as BFCL's own checker builds it: stateless classes take no configuration)."""
    from bfcl_eval.constants.executable_backend_config import (
        CLASS_FILE_PATH_MAPPING,
        STATELESS_CLASSES,
    )

    if class_name not in MULTI_TURN_CLASSES:
        raise ValueError(f"{class_name} is not one of BFCL's multi-turn classes")
    module = importlib.import_module(CLASS_FILE_PATH_MAPPING[class_name])
    instance = getattr(module, class_name)()
    if class_name not in STATELESS_CLASSES:
        # The classes keep references into their configuration and mutate it.
        instance._load_scenario(copy.deepcopy(initial_config.get(class_name, {})))
    return instance


def question_text(turn: list[dict]) -> str:
    """One turn's messages (a system message, if any, then the user's) as one text."""
    return "\n\n".join(message["content"] for message in turn)


def parallel_call_text(ground_truth_call: dict) -> str:
    """One call of a single-turn ground truth as Python-syntax text.

    BFCL lists the acceptable values of each argument; the first is used, and an
    argument whose first acceptable value is ``""`` ("may be omitted") is left out.
    Nested dicts list acceptable values per key in the same way.
    """
    ((name, options_by_argument),) = ground_truth_call.items()
    return format_call(name, _first_choices(options_by_argument))


def _first_choices(options_by_key: dict) -> dict:
    chosen = {}
    for key, options in options_by_key.items():
        value = options[0]
        if value == "":
            continue
        chosen[key] = _first_choices(value) if isinstance(value, dict) else value
    return chosen
