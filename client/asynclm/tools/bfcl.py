"""BFCL workloads for the AsyncLM evaluation (§6): questions, tools and ground-truth calls.

Four kinds of :class:`Scenario`:

* ``parallel`` (``BFCL_v4_parallel.json``) and ``live_parallel``
  (``BFCL_v4_live_parallel.json``): one question answered by independent calls,
  all in one round. Their functions exist only as JSON schemas, so they are
  executed by :class:`~.schema.SchemaStub`: the call is checked against the schema
  (function name, parameter names, required parameters) and a deterministic
  synthetic result is returned. No real work happens.
* ``multi_turn`` (``BFCL_v4_multi_turn_base.json``): a conversation of several
  user turns on stateful tools; ``question`` is the turns' texts, blank-line
  separated, and the ground truth is every turn's calls in order. The calls are
  executed by the REAL BFCL tool classes (file system, trading bot, ...), built
  from the sample's ``initial_config``. The calls depend on each other, one per round.
* ``multi_step_parallel``: as in §6, three multi-turn samples' first turns in one
  request — three independent chains of 1–5 dependent calls each. Samples are
  drawn with a fixed seed and never share a tool class, so their states and
  function names cannot collide.

Every tool carries the emulated execution time of :func:`~.latency.paper_latency`
for the loading seed; the prompt announces it, and ``build_registry().latency_s``
(equal to ``paper_latency(seed)``) makes each call take it.
"""

from __future__ import annotations

import functools
import itertools
import random
import threading

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .bfcl_data import (
    class_instance,
    func_docs,
    ground_truth_by_id,
    parallel_call_text,
    question_text,
    read_entries,
)
from .latency import PaperLatency, paper_latency
from .registry import Tool, ToolRegistry
from .schema import SchemaStub, schema_tool_text

__all__ = ["FILE_BY_KIND", "KINDS", "NUM_MULTI_STEP_PARALLEL", "Scenario", "disjoint_samples", "first_turns", "load_scenarios",
           "paper_latency"]

KINDS = ("parallel", "live_parallel", "multi_turn", "multi_step_parallel")
NUM_MULTI_STEP_PARALLEL = 200  # as many as the paper's v3-multi-step-parallel
TASKS_PER_MULTI_STEP_PARALLEL = 3
MAX_CHAIN_CALLS = 5  # "three independent tasks requiring 1–5 sequential function calls each"

FILE_BY_KIND = {
    "parallel": "BFCL_v4_parallel.json",
    "live_parallel": "BFCL_v4_live_parallel.json",
    "multi_turn": "BFCL_v4_multi_turn_base.json",
}


@dataclass(frozen=True)
class Scenario:
    """One workload sample.

    ``chains`` are the ground truth's independent call sequences: the calls of one
    chain must run in order, different chains never depend on each other.
    ``rounds`` regroups them for a synchronous-parallel executor: round ``k`` holds
    the ``k``-th call of every chain still going, all concurrently executable
    (parallel kinds: one round; multi-turn: one call per round; multi-step-parallel:
    up to three calls per round). ``source_ids`` are the BFCL entries it comes from.
    """

    id: str
    kind: str
    question: str
    functions_text: str
    rounds: list[list[str]]
    chains: list[list[str]]
    source_ids: tuple[str, ...]
    registry_factory: Callable[[], ToolRegistry] = field(repr=False, compare=False)

    @property
    def num_calls(self) -> int:
        return sum(len(chain) for chain in self.chains)

    def build_registry(self) -> ToolRegistry:
        """A fresh registry executing this scenario's functions; for multi-turn kinds
        its tool instances start from the sample's initial state."""
        return self.registry_factory()


def load_scenarios(kind: str, limit: int | None = None, seed: int = 0) -> list[Scenario]:
    """The first ``limit`` scenarios of ``kind`` (all if None), in BFCL's order.

    ``seed`` fixes the tools' emulated execution times and, for
    ``multi_step_parallel``, which samples are combined; a smaller ``limit`` gives a
    prefix of a larger one. Raises :class:`ValueError` for an unknown kind and
    :class:`ModuleNotFoundError` if the ``bfcl-eval`` wheel is not installed.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown BFCL kind {kind!r}; expected one of {KINDS}")
    latency = paper_latency(seed)
    if kind == "multi_step_parallel":
        count = NUM_MULTI_STEP_PARALLEL if limit is None else min(limit, NUM_MULTI_STEP_PARALLEL)
        return _multi_step_parallel(count, seed, latency)
    entries = read_entries(FILE_BY_KIND[kind])[:limit]
    truth_by_id = ground_truth_by_id(FILE_BY_KIND[kind])
    if kind == "multi_turn":
        return [_multi_turn(entry, truth_by_id[entry["id"]], latency) for entry in entries]
    return [_single_turn(kind, entry, truth_by_id[entry["id"]], latency) for entry in entries]


def _single_turn(kind: str, entry: dict, truth: list[dict], latency: PaperLatency) -> Scenario:
    calls = [parallel_call_text(call) for call in truth]
    schemas = entry["function"]
    return _scenario(
        entry["id"], kind, question_text(entry["question"][0]),
        chains=[[call] for call in calls],
        source_ids=(entry["id"],),
        registry_factory=lambda: _stub_registry(schemas, latency),
    )


def _multi_turn(entry: dict, truth: list[list[str]], latency: PaperLatency) -> Scenario:
    question = "\n\n".join(question_text(turn) for turn in entry["question"])
    calls = [call for turn_calls in truth for call in turn_calls]
    return _scenario(
        entry["id"], "multi_turn", question,
        chains=[calls] if calls else [],
        source_ids=(entry["id"],),
        registry_factory=lambda: _class_registry([entry], latency),
    )


def _multi_step_parallel(count: int, seed: int, latency: PaperLatency) -> list[Scenario]:
    file_name = FILE_BY_KIND["multi_turn"]
    truth_by_id = ground_truth_by_id(file_name)
    eligible = [
        entry for entry in read_entries(file_name)
        if 1 <= len(truth_by_id[entry["id"]][0]) <= MAX_CHAIN_CALLS
    ]
    rng = random.Random(seed)
    return [
        first_turns(f"multi_step_parallel_{index}", disjoint_samples(rng, eligible), truth_by_id, latency)
        for index in range(count)
    ]


def first_turns(
    scenario_id: str, samples: list[dict], truth_by_id: dict[str, list], latency: PaperLatency
) -> Scenario:
    """The first turns of multi-turn ``samples`` (whose tool classes must not overlap) as one
    request: ``Task 1: ...`` lines when there are several, each sample's calls one chain."""
    texts = [question_text(sample["question"][0]) for sample in samples]
    question = texts[0] if len(texts) == 1 else "\n".join(
        f"Task {number}: {text}" for number, text in enumerate(texts, start=1)
    )
    return _scenario(
        scenario_id, "multi_step_parallel" if len(samples) > 1 else "multi_turn", question,
        chains=[list(truth_by_id[sample["id"]][0]) for sample in samples],
        source_ids=tuple(sample["id"] for sample in samples),
        registry_factory=lambda: _class_registry(samples, latency),
    )


def disjoint_samples(rng: random.Random, eligible: list[dict]) -> list[dict]:
    """Multi-turn samples for one multi-step-parallel request: none shares a tool class with another."""
    # Rejection sampling: about a third of random triples share no class, so a few tries do.
    while True:
        samples = rng.sample(eligible, TASKS_PER_MULTI_STEP_PARALLEL)
        classes = [cls for sample in samples for cls in sample["involved_classes"]]
        if len(classes) == len(set(classes)):
            return samples


def _scenario(
    scenario_id: str, kind: str, question: str, *, chains: list[list[str]],
    source_ids: tuple[str, ...], registry_factory: Callable[[], ToolRegistry],
) -> Scenario:
    rounds = [
        [call for call in step if call is not None]
        for step in itertools.zip_longest(*chains)
    ]
    return Scenario(
        id=scenario_id, kind=kind, question=question,
        functions_text=registry_factory().describe(),
        rounds=rounds, chains=chains, source_ids=source_ids,
        registry_factory=registry_factory,
    )


def stub_registry(schemas: list[dict], seed: int = 0) -> ToolRegistry:
    """Tools with BFCL's function ``schemas`` whose calls return a stub result, as the single-turn sets'
    (for an entry of a set that has no scenario here: BFCL's irrelevance sets, bench/asynclm_abstain.py)."""
    return _stub_registry(schemas, paper_latency(seed))


def _stub_registry(schemas: list[dict], latency: PaperLatency) -> ToolRegistry:
    registry = ToolRegistry()
    for schema in schemas:
        signature, description = schema_tool_text(schema)
        registry.register(Tool(
            schema["name"], SchemaStub(schema), description, signature,
            latency.function_ms(schema["name"]), schema,
        ))
    return registry


def _class_registry(entries: list[dict], latency: PaperLatency) -> ToolRegistry:
    """Tools bound to fresh instances of each entry's classes; the sample's excluded
    functions are left out, as they are absent from the task's toolbox."""
    registry = ToolRegistry()
    for entry in entries:
        excluded = set(entry.get("excluded_function", ()))
        for class_name in entry["involved_classes"]:
            instance = class_instance(class_name, entry["initial_config"])
            # BFCL's classes are not thread-safe and the executor runs calls
            # concurrently: calls on one instance take turns.
            lock = threading.Lock()
            for schema in func_docs(class_name):
                if schema["name"] in excluded:
                    continue
                signature, description = schema_tool_text(schema)
                method = _serialized(getattr(instance, schema["name"]), lock)
                registry.register(Tool(
                    schema["name"], method, description, signature,
                    latency.function_ms(schema["name"]), schema,
                ))
    return registry


def _serialized(method: Callable[..., Any], lock: threading.Lock) -> Callable[..., Any]:
    # functools.wraps sets __wrapped__, so the registry checks the method's own signature.
    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        with lock:
            return method(*args, **kwargs)

    return call
