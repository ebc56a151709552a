"""Training and evaluation tasks from BFCL (AsyncLM §4.2: DAGs extracted from function-calling data).

* ``parallel`` / ``live_parallel``: one question, independent calls (one chain each), executed by
  the schema stubs; the answer names each call's result.
* ``multi_turn``: a sample's first turn, one chain of dependent calls on the real tool classes.
* ``multi_step_parallel``: three first turns of samples with disjoint tool classes in one request
  (as ``load_scenarios`` composes them), three chains. Training composes its own from training ids.
* ``irrelevance`` / ``live_irrelevance``: a request beside tools that cannot serve it; the right
  answer makes no call and says so (:data:`NO_CALL_REPLY`). :func:`mismatched_tasks` makes more of
  them from ``parallel``'s training ids: one sample's tools with another's question, so that the same
  tools are seen with a request they serve and with one they do not.

Multi-turn tool classes describe 20-30 functions each (2,000-5,500 prompt tokens), too many for
a 135M model's training budget on a CPU, so these tasks list the called functions plus up to
``NUM_DISTRACTORS`` others of the same classes. Ids come from the split's side only.
"""

from __future__ import annotations

import random

from ..tools import ToolRegistry, format_call, load_scenarios, parse_call
from ..tools.bfcl import MAX_CHAIN_CALLS, Scenario, disjoint_samples, first_turns, stub_registry
from ..tools.bfcl_data import ground_truth_by_id, question_text, read_entries
from ..tools.latency import paper_latency
from ..tools.registry import result_text
from .split import bfcl_ids
from .tasks import Subtask, Task, fixed_call, function_name, no_call

IRRELEVANCE_KINDS = ("irrelevance", "live_irrelevance")
BFCL_KINDS = ("parallel", "live_parallel", "multi_turn", "multi_step_parallel") + IRRELEVANCE_KINDS
# What the model says where none of its tools applies: one fixed sentence, so that abstaining is
# learnt as a behaviour rather than as answers a 135M model would make up.
NO_CALL_REPLY = "None of my functions can help with this request."
NUM_DISTRACTORS = 4
RESULT_CHARS = 100  # a longer result is cut in the answer
_MULTI_TURN_FILE = "BFCL_v4_multi_turn_base.json"


def summary(name: str, value) -> str:
    """One line telling the user what a call returned: the stub's result id, or the value, cut short."""
    if isinstance(value, dict) and "result_id" in value:
        return f"{name} returned result {value['result_id']}."
    text = result_text(value)
    return f"{name} returned {text if len(text) <= RESULT_CHARS else text[:RESULT_CHARS] + '...'}."


def keyword_call(call: str, registry: ToolRegistry) -> str:
    """``call`` with its positional arguments named by the tool's signature, the one form training
    shows: BFCL's multi-turn ground truth writes ``get_zipcode_based_on_city('Rivermist')`` in some
    samples and ``(city='Rivermist')`` in others. Calls without positional arguments keep their text."""
    parsed = parse_call(call)
    named = registry.named(parsed)
    return call if named is parsed or named.args else format_call(named.name, named.kwargs)


def _subtask(chain: list[str], registry: ToolRegistry) -> Subtask:
    chain = [keyword_call(call, registry) for call in chain]
    names = [function_name(call) for call in chain]
    return Subtask(tuple(fixed_call(call) for call in chain),
                   lambda results: " ".join(summary(n, r) for n, r in zip(names, results)))


def _task(scenario: Scenario, rng: random.Random, trim: bool) -> Task:
    called = {function_name(call) for chain in scenario.chains for call in chain}
    keep = set(called)
    every_tool = scenario.build_registry()
    if trim:
        others = [tool.name for tool in every_tool if tool.name not in called]
        keep |= set(rng.sample(others, min(NUM_DISTRACTORS, len(others))))

    def registry() -> ToolRegistry:
        return ToolRegistry([tool for tool in scenario.build_registry() if tool.name in keep])

    subtasks = tuple(_subtask(chain, every_tool) for chain in scenario.chains)
    return Task(scenario.id, scenario.kind, scenario.question, subtasks, registry)


def bfcl_tasks(kind: str, split: str, rng: random.Random, count: int | None = None) -> list[Task]:
    """The split's tasks of ``kind`` in BFCL's order; for multi-step-parallel, ``count`` compositions
    (training: drawn from training samples; evaluation: ``load_scenarios``' own whose samples are all
    evaluation samples)."""
    if kind not in BFCL_KINDS:
        raise ValueError(f"unknown BFCL kind {kind!r}; expected one of {', '.join(BFCL_KINDS)}")
    latency = paper_latency(0)  # replaced by each simulation's random estimates
    if kind in IRRELEVANCE_KINDS:
        return _no_call_tasks(kind, split)
    if kind in ("parallel", "live_parallel"):
        ids = set(bfcl_ids(kind, split))
        return [_task(s, rng, trim=False) for s in load_scenarios(kind) if s.id in ids]
    ids = set(bfcl_ids("multi_turn", split))
    truth_by_id = ground_truth_by_id(_MULTI_TURN_FILE)
    entries = [e for e in read_entries(_MULTI_TURN_FILE)
               if e["id"] in ids and 1 <= len(truth_by_id[e["id"]][0]) <= MAX_CHAIN_CALLS]
    if kind == "multi_turn":
        return [_task(first_turns(e["id"], [e], truth_by_id, latency), rng, trim=True) for e in entries]
    if split == "eval":  # the bench's own compositions, those made of evaluation samples only
        scenarios = [s for s in load_scenarios("multi_step_parallel") if set(s.source_ids) <= ids]
        return [_task(s, rng, trim=True) for s in scenarios[:count]]
    return [_task(first_turns(f"train_multi_step_parallel_{index}", disjoint_samples(rng, entries), truth_by_id,
                              latency), rng, trim=True)
            for index in range(count or 0)]


def _no_call_tasks(kind: str, split: str) -> list[Task]:
    """The split's entries of an irrelevance set, each one subtask that needs no call."""
    ids = set(bfcl_ids(kind, split))
    reply = no_call(NO_CALL_REPLY)
    return [Task(entry["id"], kind, question_text(entry["question"][0]), (reply,),
                 lambda functions=entry["function"]: stub_registry(functions))
            for entry in read_entries(f"BFCL_v4_{kind}.json") if entry["id"] in ids]


def mismatched_tasks(rng: random.Random, count: int) -> list[Task]:
    """``count`` training tasks, each a ``parallel`` training sample's tools beside another such
    sample's question, the two sharing no function name; the answer makes no call."""
    tasks = bfcl_tasks("parallel", "train", rng)
    names = [{tool.name for tool in task.registry()} for task in tasks]
    reply = no_call(NO_CALL_REPLY)
    made = []
    for index in range(count):
        tools = index % len(tasks)
        question = rng.choice([i for i in range(len(tasks)) if not names[i] & names[tools]])
        made.append(Task(f"mismatched_{index}", "mismatched", tasks[question].question, (reply,),
                         tasks[tools].registry_factory))
    return made
