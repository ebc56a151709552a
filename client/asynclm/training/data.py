"""``oven asynclm-data``: training and evaluation samples for AsyncLM fine-tuning (§4.2), as JSONL.

Every task is simulated once per variant it gets: ``async`` (LPT order, interrupts where they
land, traps, user follow-ups in some), ``sync-cml`` (the inferlet's sync mode: each call waits)
and ``sync`` (chat turns without CML). A training task gets one variant, drawn with the
``--variants`` weights; an evaluation task gets all three (the columns of the paper's Table 1).
Each simulation draws its own time per output token (5-30 ms) and estimated execution times
(1 ms-1 s, in the prompt), except that training demo tasks share one table of times per
``group`` of them: their system prompts are then equal, and the trainer forwards that prefix once
per batch. Randomness comes from ``(seed, task id, variant)``: the same arguments give the same bytes.

A record: ``id``, ``task_id``, ``source``, ``split``, ``variant``, ``question``, ``follow_up`` (the
user's text, if any) and ``follow_up_ms``, ``functions`` (the prompt's function list),
``estimates_ms``, ``tpot_ms``, ``calls`` (in the order written), ``facts`` (strings the answer must
contain), ``num_traps``, ``system_tokens`` (how many ids are the system turn), ``ids`` (token ids)
and ``loss_spans`` ([start, end) ranges of ``ids`` the model wrote). ``data.json`` beside the files
holds the arguments, the counts and the SHA-256 of both files together.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, replace
from pathlib import Path

from ..tools import ToolError
from .bfcl_tasks import BFCL_KINDS, IRRELEVANCE_KINDS, bfcl_tasks, mismatched_tasks
from .demo_tasks import FOLLOW_UP_PROBABILITY, TRAINING_MIX, DemoTaskMaker, TrainingMix
from .names import Words, vocabulary_words
from .plain import plain_sync
from .segments import Encoder, flatten
from .simulate import CmlSimulation, Timing, Transcript
from .tasks import Task, random_estimates

VARIANTS = ("async", "sync-cml", "sync")
SOURCES = ("demo",) + BFCL_KINDS
DEFAULT_WEIGHTS = {"async": 0.8, "sync-cml": 0.2, "sync": 0.0}
MIN_TPOT_MS, MAX_TPOT_MS = 5.0, 30.0
DATA_FILES = ("train.jsonl", "eval.jsonl", "data.json")  # what `oven asynclm-data` writes


@dataclass(frozen=True)
class DataConfig:
    seed: int = 0
    demo_train: int = 700           # generated demo tasks for training
    demo_eval: int = 50             # generated demo tasks with held-out entities
    parallel_repeats: int = 1       # simulations per BFCL parallel / live-parallel training id
    multi_turn_train: int = 20      # BFCL multi-turn first turns for training (of 49)
    multi_step_train: int = 6       # multi-step-parallel compositions of training ids
    multi_step_eval: int = 92       # the bench's compositions made of evaluation ids (all 92)
    irrelevance_train: int | None = None  # training entries of each irrelevance set, first in file order (None: all)
    mismatched_train: int = 0       # parallel training samples' tools beside another's question (no call)
    weights: tuple[tuple[str, float], ...] = tuple(DEFAULT_WEIGHTS.items())
    max_tokens: int = 1536          # longer samples are left out (counted)
    group: int = 24                 # training demo tasks that share one table of estimated times
    sources: tuple[str, ...] = SOURCES
    mix: TrainingMix = TRAINING_MIX  # how training demo tasks differ from evaluation ones

    def __post_init__(self) -> None:
        for name in ("demo_train", "demo_eval", "parallel_repeats", "multi_turn_train", "multi_step_train",
                     "multi_step_eval", "group", "irrelevance_train", "mismatched_train"):
            if (getattr(self, name) or 0) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.max_tokens < 1:  # every sample would be left out
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not self.sources or set(self.sources) - set(SOURCES):
            raise ValueError(f"sources must be some of {', '.join(SOURCES)}, got {', '.join(self.sources)}")
        unknown = [v for v, _ in self.weights if v not in VARIANTS]
        if unknown or not self.weights or any(w < 0 for _, w in self.weights) or not sum(w for _, w in self.weights):
            raise ValueError(f"variant weights must name {', '.join(VARIANTS)} with weights >= 0, not all 0")


def parse_weights(text: str) -> tuple[tuple[str, float], ...]:
    """``"async=0.7,sync-cml=0.2,sync=0.1"`` (or just ``"async"``: weight 1)."""
    weights = []
    for item in text.split(","):
        name, _, weight = item.strip().partition("=")
        try:
            weights.append((name, float(weight) if weight else 1.0))
        except ValueError:
            raise ValueError(f"bad variant weight {item!r}: expected NAME or NAME=NUMBER") from None
    return tuple(weights)


def random_timing(task: Task, variant: str, encoder: Encoder, rng: random.Random,
                  estimate_ms_by_name: dict[str, int] | None = None) -> Timing:
    """A simulation's clock: random times per function (unless given) and per output token, and
    when the user's follow-up comes, if the task has one."""
    timing = Timing(estimate_ms_by_name or random_estimates(rng, task.registry()),
                    round(rng.uniform(MIN_TPOT_MS, MAX_TPOT_MS), 1))
    if task.follow_up is not None and variant != "sync":
        # The follow-up arrives while the model is still at work on the rest: time it on a run without it.
        end_ms = CmlSimulation(replace(task, follow_up=None), encoder, timing, variant).run().end_ms
        timing = replace(timing, follow_up_ms=round(rng.uniform(0.1, 0.7) * end_ms, 1))
    return timing


def simulate(task: Task, variant: str, encoder: Encoder, rng: random.Random,
             estimate_ms_by_name: dict[str, int] | None = None) -> tuple[Transcript, Timing]:
    """One simulated interaction of ``task`` in ``variant`` on a :func:`random_timing` clock."""
    timing = random_timing(task, variant, encoder, rng, estimate_ms_by_name)
    if variant == "sync":
        return plain_sync(task, encoder, timing), timing
    return CmlSimulation(task, encoder, timing, variant).run(), timing


def record(task: Task, split: str, variant: str, transcript: Transcript, timing: Timing) -> dict:
    ids, spans = flatten(transcript.segments)
    return {"id": f"{task.task_id}/{variant}", "task_id": task.task_id, "source": task.source, "split": split,
            "variant": variant, "question": task.question,
            "follow_up": task.follow_up.text if task.follow_up else None, "follow_up_ms": timing.follow_up_ms,
            "functions": task.registry(timing.estimate_ms_by_name).describe(),
            "estimates_ms": timing.estimate_ms_by_name, "tpot_ms": timing.tpot_ms, "calls": transcript.calls,
            "facts": transcript.facts, "num_traps": transcript.num_traps, "system_tokens": transcript.system_tokens,
            "ids": ids, "loss_spans": spans}


def tasks_for(split: str, config: DataConfig, words: Words | None = None) -> list[Task]:
    """The split's tasks; training demo tasks take made-up names from ``words`` (see names.py)."""
    rng = random.Random(f"{config.seed}:{split}:tasks")
    tasks = []
    if "demo" in config.sources:
        maker = DemoTaskMaker(split, rng, words, config.mix)
        for i in range(config.demo_train if split == "train" else config.demo_eval):
            follow_up = split == "train" and rng.random() < FOLLOW_UP_PROBABILITY
            tasks.append(maker.make(f"demo_{split}_{i}", follow_up))
    for kind in ("parallel", "live_parallel"):
        if kind in config.sources:
            tasks += bfcl_tasks(kind, split, rng)
    if "multi_turn" in config.sources:
        multi_turn = bfcl_tasks("multi_turn", split, rng)
        tasks += multi_turn[:config.multi_turn_train] if split == "train" else multi_turn
    if "multi_step_parallel" in config.sources:
        tasks += bfcl_tasks("multi_step_parallel", split, rng,
                            config.multi_step_train if split == "train" else config.multi_step_eval)
    for kind in IRRELEVANCE_KINDS:
        if kind in config.sources:
            tasks += bfcl_tasks(kind, split, rng)[:config.irrelevance_train if split == "train" else None]
    if split == "train" and config.mismatched_train:
        tasks += mismatched_tasks(random.Random(f"{config.seed}:mismatched"), config.mismatched_train)
    return tasks


def build(split: str, config: DataConfig, encoder: Encoder, exclude_questions: frozenset[str] = frozenset(),
          progress=lambda n, total: None) -> tuple[list[dict], dict[str, int]]:
    """The split's records and what was left out, by reason."""
    records, dropped = [], {"tool error": 0, "too long": 0, "seen in eval": 0}
    tasks = tasks_for(split, config, vocabulary_words(encoder.tokenizer) if split == "train" else None)

    def shared_estimates(n: int, task: Task) -> dict[str, int] | None:
        # Training demo tasks come in groups with one table of times, so their system prompts are
        # equal and the trainer computes that prefix once per group (see batches.py).
        if split != "train" or task.source != "demo" or config.group <= 1:
            return None
        return random_estimates(random.Random(f"{config.seed}:estimates:{n // config.group}"), task.registry())
    names, weights = zip(*config.weights)
    for n, task in enumerate(tasks):
        progress(n, len(tasks))
        if task.question in exclude_questions:
            dropped["seen in eval"] += 1
            continue
        repeats = config.parallel_repeats if split == "train" and task.source in ("parallel", "live_parallel") else 1
        for repeat in range(repeats):
            task_id = task.task_id if repeats == 1 else f"{task.task_id}#{repeat}"
            pick = random.Random(f"{config.seed}:{task_id}:variant")
            variants = VARIANTS if split == "eval" else (
                ("async",) if task.follow_up else (pick.choices(names, weights)[0],))
            for variant in variants:
                rng = random.Random(f"{config.seed}:{task_id}:{variant}")
                try:
                    transcript, timing = simulate(task, variant, encoder, rng, shared_estimates(n, task))
                except ToolError:
                    dropped["tool error"] += 1
                    continue
                rec = record(replace(task, task_id=task_id), split, variant, transcript, timing)
                if len(rec["ids"]) > config.max_tokens:
                    dropped["too long"] += 1
                    continue
                records.append(rec)
    return records, dropped


def write(records_by_split: dict[str, list[dict]], out_dir: Path, meta: dict) -> str:
    """Write ``<split>.jsonl`` files and ``data.json``; the SHA-256 of the files, in split order."""
    out_dir.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    for split, records in records_by_split.items():
        data = "".join(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n" for r in records).encode()
        digest.update(data)
        (out_dir / f"{split}.jsonl").write_bytes(data)
    meta = {**meta, "sha256": digest.hexdigest()}
    (out_dir / "data.json").write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
    return meta["sha256"]


def read_meta(out_dir: Path) -> dict:
    """The ``data.json`` that ``write`` left in ``out_dir`` ({} where there is none)."""
    path = out_dir / "data.json"
    try:
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except ValueError as exc:  # not JSON, or not UTF-8
        raise ValueError(f"{path}: not valid JSON ({exc})") from None


# What every consumer of samples reads: training (ids, spans), --variants, --exclude, --rollouts.
SAMPLE_FIELDS = {"id": (str, "a string"), "variant": (str, "a string"), "question": (str, "a string"),
                 "system_tokens": (int, "an integer"), "ids": (list, "an array"), "loss_spans": (list, "an array")}


def read_records(path: Path) -> list[dict]:
    """The samples of a JSONL file of ``write``. A wrong file fails here, before any slow work, in one
    line naming it (and the line in it): FileNotFoundError where it is missing, else ValueError."""
    if path.is_dir():
        raise ValueError(f"{path}: a folder, not a JSONL file of samples")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    records = []
    with path.open(encoding="utf-8") as f:
        try:
            for number, line in enumerate(f, 1):
                if line.strip():
                    records.append(_checked_sample(json.loads(line)))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number}: not JSON ({exc.msg})") from None
        except (TypeError, KeyError) as exc:
            raise ValueError(f"{path}:{number}: not an AsyncLM sample ({exc.args[0]})") from None
        except UnicodeDecodeError:
            raise ValueError(f"{path}: not UTF-8 text") from None
    return records


def prompt_of(record: dict) -> list[int]:
    """A sample's prompt: its ids before the first the model writes."""
    return record["ids"][:record["loss_spans"][0][0]]


def _checked_sample(value) -> dict:
    """``value`` if it is an object with :data:`SAMPLE_FIELDS`; else TypeError or KeyError saying what is wrong."""
    if not isinstance(value, dict):
        raise TypeError(f"{json.dumps(value)[:40]} is not a JSON object")
    for name, (kind, described) in SAMPLE_FIELDS.items():
        if name not in value:
            raise KeyError(f"missing {name!r}")
        if not isinstance(value[name], kind):
            raise TypeError(f"{name!r} is not {described}")
    return value
