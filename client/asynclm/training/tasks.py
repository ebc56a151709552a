"""What the training samples are made of: a task is a question and independent chains of calls.

A :class:`Subtask` is one chain of the task's DAG: calls that run in order, each built from the
results before it (convert the price just looked up), and the sentence that tells the user its
results. Different subtasks never depend on each other. A :class:`Task` is a question, its
subtasks, optionally one more subtask the user asks for while the model works (a user interrupt,
AsyncLM §6.6), and the tools that run its calls with the execution times the prompt announces.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ..tools import ToolRegistry, parse_call, spaced_call

MIN_ESTIMATE_MS, MAX_ESTIMATE_MS = 1, 1000  # §4.2: random estimated execution times, 1 ms to 1 s


@dataclass(frozen=True)
class Subtask:
    """A chain: ``steps[k](results)`` is the k-th call's text given the parsed results of the calls
    before it; ``sentence(results)`` tells the user all of them; ``facts(results)`` are the strings
    an answer must contain (the returned values, as the tools wrote them)."""

    steps: tuple[Callable[[list[Any]], str], ...]
    sentence: Callable[[list[Any]], str]
    facts: Callable[[list[Any]], list[str]] = lambda results: []

    def call(self, k: int, results: list[Any]) -> str:
        """The k-th call as the model writes it: string arguments open with a space (``spaced_call``)."""
        return spaced_call(self.steps[k](results))


@dataclass(frozen=True)
class FollowUp:
    """A subtask the user adds mid-way, as ``[INTR] user [HEAD] text [END]``."""

    text: str
    subtask: Subtask


@dataclass(frozen=True)
class Task:
    task_id: str
    source: str  # "demo", or the BFCL kind
    question: str
    subtasks: tuple[Subtask, ...]
    registry_factory: Callable[[], ToolRegistry] = field(repr=False, compare=False)
    follow_up: FollowUp | None = None

    def registry(self, estimate_ms_by_name: dict[str, int] | None = None) -> ToolRegistry:
        """A fresh registry; with ``estimate_ms_by_name``, its tools announce those times."""
        registry = self.registry_factory()
        if estimate_ms_by_name is None:
            return registry
        return ToolRegistry([replace(tool, latency_ms=estimate_ms_by_name[tool.name]) for tool in registry])


def no_call(reply: str) -> Subtask:
    """A request the model answers with ``reply`` and no call (small talk, a request no tool serves)."""
    return Subtask((), lambda results: reply)


def random_estimates(rng, registry: ToolRegistry) -> dict[str, int]:
    """One estimated execution time per function, uniform in 1 ms .. 1 s (whole ms, as the prompt shows)."""
    return {tool.name: rng.randint(MIN_ESTIMATE_MS, MAX_ESTIMATE_MS) for tool in registry}


def fixed_call(text: str) -> Callable[[list[Any]], str]:
    """A step whose call does not depend on earlier results."""
    return lambda results: text


def parse_value(text: str) -> Any:
    """A result as the model reads it: JSON where it is JSON, else the text."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def function_name(call: str) -> str:
    return parse_call(call).name
