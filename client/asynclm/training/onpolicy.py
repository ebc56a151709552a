"""On-policy samples (DAgger): the fine-tuned model drives a simulation, the ideal model corrects it.

Training samples written by the ideal model (simulate.py) only ever show contexts the ideal model
reaches. A fine-tuned model that once writes something else (a sentence before a call, a call
nobody asked for, a misspelt name) is in a context it never saw, and its errors compound there.
Here the model writes each unit (one call, one line of text, a trap, or the end of its turn)
greedily from the simulation's context, as the check does; where the unit is one the ideal model
could write now, it is kept, with the model's own tokens; where it is not, the unit the ideal
model could write that agrees longest with the model's replaces it (a correction; the ideal
model's own choice among equals) and the model goes on from there. A sample with at least one
correction teaches the fix in the model's own contexts; its loss falls on all it writes. Each
correction also names the *rejected* token: the first one the model wrote that no unit the ideal
model could write goes on with, at its position in the sample (where the sample has the right
token instead), so training can push that very choice down (``oven asynclm-train --reject-weight``).

A unit the ideal model could write: any ready call (the next call of a chain whose results are
in, with the next id), else the sentence of any chain whose results are all in, else what the
ideal model writes (a trap while calls run, else the end of the turn).
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from oven.proto.peft_folder import WEIGHTS_FILE, read_config

from .data import DataConfig, random_timing, record, tasks_for
from .decoder import DECODERS, make_decoder
from .demo_tasks import TRAINING_MIX, TrainingMix
from .names import vocabulary_words
from .segments import Encoder, common_prefix_length, flatten
from .simulate import CmlSimulation, Timing
from .tasks import Task

MAX_UNIT_TOKENS = 160  # a unit longer than any call or sentence the ideal model writes
# The sources whose number of training tasks --tasks sets; BFCL parallel and live_parallel simulate
# every training id instead, so a run could not say how many it draws.
ROLLOUT_SOURCES = ("demo", "multi_turn", "multi_step_parallel")


class OnPolicySimulation(CmlSimulation):
    """``task`` in async mode with the model of a decoder's ``session`` (decoder.py) writing and the
    ideal model correcting it."""

    def __init__(self, task: Task, encoder: Encoder, timing: Timing, session):
        super().__init__(task, encoder, timing, "async")
        self.session = session
        self.stop_ids = set(encoder.tokenizer.stop_token_ids)
        self.corrections: list[dict] = []  # where the model was corrected: what it wrote, what instead

    def _next_text(self) -> list[int] | None:
        start = sum(len(segment.token_ids) for segment in self.segments)  # where the unit's ids go
        ids, text, wrote = self._propose()
        options = self._options()
        if text in options:
            options[text]()
            if text == "":  # the end of the turn
                return None
            return ids
        # the option that agrees longest with what the model wrote (the ideal model's first among equals):
        # the sample keeps the model's own tokens up to where it went wrong, and that token is the rejection
        written = {text: self.encoder.encode(text) + ([] if text else [self.encoder.end_of_turn_id])
                   for text in options}
        agree = {text: common_prefix_length(wrote, option_ids) for text, option_ids in written.items()}
        chosen = max(options, key=lambda text: agree[text])  # max keeps the first of equals
        options[chosen]()
        correction = {"wrote": self.encoder.decode(wrote), "instead": chosen}
        at = agree[chosen]
        if at < len(wrote) and not self._spelled_otherwise(wrote[:at + 1], options):
            correction["rejected"] = [start + at, wrote[at]]  # the token the model should not have written there
        self.corrections.append(correction)
        return None if chosen == "" else written[chosen]

    def _spelled_otherwise(self, wrote: list[int], options) -> bool:
        """Whether ``wrote`` is the start of an option's text in other tokens (then its last token is no error)."""
        if wrote[-1] in self.stop_ids:
            return False
        text = self.encoder.decode(wrote)
        return any(option.startswith(text) for option in options if option)

    def _options(self) -> dict[str, Callable[[], None]]:
        """Each unit the ideal model could write now (``""``: end the turn) and what writing it does,
        the ideal model's choice first."""
        ready = [i for i, chain in enumerate(self.chains) if chain.ready]
        if ready:
            ready.sort(key=lambda i: -self._estimate_ms(self._next_call(i)))  # LPT, ties in task order
            call_id = f"t{len(self.calls) + 1}"
            return {self.prompt.call_text(call_id, self._next_call(i)): (lambda i=i: self._write_call(i))
                    for i in ready}
        unstated = [i for i in self.completed if not self.chains[i].stated]
        if unstated:
            return {self.subtasks[i].sentence(self.chains[i].results) + "\n":
                    (lambda i=i: setattr(self.chains[i], "stated", True)) for i in unstated}
        if self._results_owed:
            return {self.prompt.TRAP_TEXT: lambda: None}
        return {"": lambda: None}

    def _propose(self) -> tuple[list[int], str, list[int]]:
        """The unit the model writes greedily from here: its ids and text (``""``: it ends its turn;
        an end while results are owed is a trap, as in the inferlet), and the tokens it chose (with
        the end token where it stopped before the end of a line)."""
        context, _ = flatten(self.segments)
        monitor = copy.deepcopy(self.monitor)
        written, stopped = [], False
        while len(written) < MAX_UNIT_TOKENS:
            token = self._choose(monitor, self.session.ranked(context + written))
            if token is None:
                stopped = True
                break
            written.append(token)
            monitor.feed(token)
            if monitor.interruptible:  # a line ended outside every block
                break
        wrote = written + ([self.encoder.end_of_turn_id] if stopped else [])
        if not written:
            trap = self.prompt.TRAP_TEXT
            return (self.encoder.encode(trap), trap, wrote) if self._results_owed else ([], "", wrote)
        return written, self.encoder.decode(written), wrote

    def _choose(self, monitor, ranked: list[int]) -> int | None:
        for token in ranked:
            if token in self.stop_ids:
                if monitor.in_critical_section:
                    continue
                return None
            if monitor.allowed(token):
                return token
        return None


@dataclass(frozen=True)
class OnPolicyConfig:
    adapter: Path                   # the PEFT adapter folder of the model that writes
    seed: int                       # of the training tasks (use one no data set was made with)
    tasks: int = 200
    source: str = "demo"            # ROLLOUT_SOURCES: generated demo tasks, or BFCL training first turns
                                    # (at most the 49 short enough) or compositions of three of them
    mix: TrainingMix = TRAINING_MIX
    model: str = "smollm2-135m-instruct"
    decoder: str = "engine"         # decoder.DECODERS
    parallel: int = 32              # tasks at once (threads; the engine batches their steps)
    threads: int = 1                # torch threads
    exclude: frozenset[str] = frozenset()  # questions no task may have (the evaluation's)

    def __post_init__(self) -> None:
        if self.tasks < 1 or self.parallel < 1 or self.threads < 1:
            raise ValueError(f"tasks, parallel and threads must be >= 1, got {self.tasks}, {self.parallel} "
                             f"and {self.threads}")
        if self.source not in ROLLOUT_SOURCES:
            raise ValueError(f"source must be one of {', '.join(ROLLOUT_SOURCES)}, not {self.source!r}")
        if self.decoder not in DECODERS:
            raise ValueError(f"decoder must be one of {', '.join(DECODERS)}, not {self.decoder!r}")
        read_config(self.adapter)  # a bad folder fails here, in one line, not after the engine starts
        if not (self.adapter / WEIGHTS_FILE).is_file():
            raise FileNotFoundError(f"{self.adapter}: not an adapter folder (no {WEIGHTS_FILE})")


def collect(config: OnPolicyConfig, progress=lambda done, total, task_id, corrections: None) -> tuple[list[dict], int]:
    """The samples of the tasks where the model was corrected (with their ``corrections``), in task
    order, and how many tasks ran."""
    from concurrent.futures import ThreadPoolExecutor

    from oven.control.tokenizer import Tokenizer

    tasks = _tasks(config)
    decoder, source = make_decoder(config.decoder, config.model, config.adapter, config.threads, config.parallel)
    encoder = Encoder(Tokenizer(source.tokenizer))

    def run(task: Task) -> tuple[dict | None, list[dict]]:
        timing = random_timing(task, "async", encoder, random.Random(f"{config.seed}:{task.task_id}:on-policy"))
        session = decoder.session()
        try:
            simulation = OnPolicySimulation(task, encoder, timing, session)
            transcript = simulation.run()
        finally:
            session.close()
        if not simulation.corrections:
            return None, []
        return {**record(task, "train", "async", transcript, timing), "corrections": simulation.corrections}, \
            simulation.corrections

    samples = []
    try:
        with ThreadPoolExecutor(decoder.max_sessions) as pool:
            for done, (task, (sample, corrections)) in enumerate(zip(tasks, pool.map(run, tasks)), 1):
                progress(done, len(tasks), task.task_id, corrections)
                if sample is not None:
                    samples.append(sample)
    finally:
        decoder.close()
    return samples, len(tasks)


def _tasks(config: OnPolicyConfig) -> list[Task]:
    from oven.control.tokenizer import Tokenizer
    from oven.inference.models import resolve_model

    words = vocabulary_words(Tokenizer(resolve_model(config.model).tokenizer))
    data_config = DataConfig(seed=config.seed, demo_train=config.tasks, multi_turn_train=config.tasks,
                             multi_step_train=config.tasks, sources=(config.source,), mix=config.mix)
    return [task for task in tasks_for("train", data_config, words) if task.question not in config.exclude]
