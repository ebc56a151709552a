"""The fixed train/eval split (``split.json``) and the demo tasks' entity pools (``entities.json``).

BFCL samples are split by id, per data file: training never sees an evaluation id, and a
multi-step-parallel composition is for training only when all of its samples are. Demo tasks
are split by entity: the evaluation's cities, stock symbols, currencies and search queries
never appear in a training task.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

SPLITS = ("train", "eval")
_HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Pools:
    """The entities one split's demo tasks draw from."""

    cities: tuple[str, ...]
    symbols: tuple[str, ...]
    currencies: tuple[str, ...]
    search_queries: tuple[str, ...]
    held_out_currencies: tuple[str, ...]  # eval: every conversion uses one; train: none does


@cache
def _read(name: str) -> dict:
    return json.loads((_HERE / name).read_text(encoding="utf-8"))


def bfcl_ids(kind: str, split: str) -> tuple[str, ...]:
    """The BFCL ids of data file ``kind`` (parallel, live_parallel, multi_turn, irrelevance, live_irrelevance) in ``split``."""
    by_kind = _read("split.json")["bfcl"]
    if kind not in by_kind:
        raise ValueError(f"unknown BFCL kind {kind!r}; expected one of {', '.join(by_kind)}")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    return tuple(by_kind[kind][split])


def demo_pools(split: str, currencies: tuple[str, ...]) -> Pools:
    """Entity pools for ``split``; ``currencies`` are the ones the demo converter knows."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    entities, held = _read("entities.json"), _read("split.json")["demo_eval_entities"]

    def pick(pool: list[str], held_out: list[str]) -> tuple[str, ...]:
        held_set = set(held_out)
        return tuple(x for x in pool if (x in held_set) == (split == "eval"))

    return Pools(
        cities=pick(entities["cities"], held["cities"]),
        symbols=pick(entities["symbols"], held["symbols"]),
        currencies=currencies if split == "eval" else tuple(c for c in currencies if c not in held["currencies"]),
        search_queries=pick(entities["search_queries"], held["search_queries"]),
        held_out_currencies=tuple(held["currencies"]),
    )
