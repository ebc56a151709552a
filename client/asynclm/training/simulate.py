"""Simulated interactions on a task's DAG (AsyncLM §4.2): what an ideal model writes, and where the
serving system puts each interrupt.

Time is counted in generated tokens: each token the model writes costs ``tpot_ms``; injected
text costs nothing (it is prefilled with the next step). A call starts when the token that closes
its ``[END]`` is written and finishes its estimated execution time later. Its interrupt goes in at
the first token boundary after that at which the inferlet's token monitor is outside every CML
block and at the start of a line (``TokenMonitor.interruptible``), which is where ``Agent._inject``
puts it; the monitor here is the inferlet's own.

The ideal model, at each point where it chooses what to write next:

1. calls a function whose inputs are all in the context: the one with the longest estimated
   execution time (LPT, §4.1) in ``async`` mode, the first in task order in ``sync-cml`` mode;
2. else tells the user the results of a chain whose results are all in (one sentence);
3. else, with calls still running, writes ``[TRAP][END]``; the wait ends at the next interrupt;
4. else ends its turn.

``sync-cml`` is the inferlet's ``sync`` mode: every call waits for its result (no traps).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import protocol
from .segments import Encoder, Segment
from .tasks import Task, function_name, parse_value

CML_MODES = ("async", "sync-cml")


@dataclass(frozen=True)
class Timing:
    """One simulation's clock: the announced (and actual) time of each function, the time per
    output token, and when the user's follow-up arrives (None: no follow-up)."""

    estimate_ms_by_name: dict[str, int]
    tpot_ms: float
    follow_up_ms: float | None = None


@dataclass
class Transcript:
    segments: list[Segment]
    calls: list[str]                  # every call, in the order the model wrote them
    facts: list[str]                  # strings the answer must contain
    end_ms: float                     # when the model ended its turn
    system_tokens: int                # the first ids that are the system turn
    num_traps: int = 0


@dataclass
class _Event:
    arrival_ms: float
    seq: int
    call_id: str                      # "user" for the follow-up
    value: str
    chain: int


@dataclass
class _Chain:
    steps: tuple
    known: bool = True                # False for the follow-up until the user sends it
    results: list = field(default_factory=list)  # parsed results in the context
    num_called: int = 0
    stated: bool = False

    @property
    def complete(self) -> bool:
        return len(self.results) == len(self.steps)

    @property
    def ready(self) -> bool:
        return self.known and self.num_called < len(self.steps) and len(self.results) == self.num_called


class CmlSimulation:
    """One run of ``task`` in a CML mode; :meth:`run` gives its transcript."""

    def __init__(self, task: Task, encoder: Encoder, timing: Timing, mode: str):
        if mode not in CML_MODES:
            raise ValueError(f"mode {mode!r} is not one of {CML_MODES}")
        if task.follow_up is not None and (mode != "async" or timing.follow_up_ms is None):
            raise ValueError(f"{task.task_id}: a follow-up needs async mode and an arrival time")
        self.task, self.encoder, self.timing, self.mode = task, encoder, timing, mode
        self.prompt = protocol.prompt()
        self.registry = task.registry(timing.estimate_ms_by_name)
        self.monitor = protocol.cml().TokenMonitor(lambda token: encoder.decode([token]))
        self.subtasks = list(task.subtasks) + ([task.follow_up.subtask] if task.follow_up else [])
        self.chains = [_Chain(s.steps) for s in self.subtasks]
        self.queue: list[_Event] = []
        self.chain_by_call_id: dict[str, int] = {}
        # chains in the order their last result came in (one that needs no call is done at once)
        self.completed: list[int] = [i for i, subtask in enumerate(self.subtasks) if not subtask.steps]
        self.now_ms = 0.0
        self.calls: list[str] = []
        self.num_traps = 0
        if task.follow_up:
            self.chains[-1].known = False
            self.queue.append(_Event(timing.follow_up_ms, -1, "user", task.follow_up.text, len(self.chains) - 1))

    def run(self) -> Transcript:
        system = self.prompt.system_prompt(self.registry.describe())
        self.segments = [self.encoder.prompt(system, self.task.question)]
        pending: list[int] = []  # the rest of the text the model is writing
        while True:
            if not pending:
                pending = self._next_text()
                if pending is None:
                    self._write(self.encoder.end_of_turn_id)
                    break
            token = pending.pop(0)
            self._write(token)
            self.now_ms += self.timing.tpot_ms
            for event in self.monitor.feed(token):
                self._on(event)
            if self.monitor.interruptible:
                self._inject()
        facts = [f for subtask, chain in zip(self.subtasks, self.chains) for f in subtask.facts(chain.results)]
        system_tokens = self.encoder.system_length(system, self.segments[0].token_ids)
        return Transcript(self.segments, self.calls, facts, self.now_ms, system_tokens, self.num_traps)

    # -- the model --------------------------------------------------------------------------
    def _next_text(self) -> list[int] | None:
        ready = [i for i, chain in enumerate(self.chains) if chain.ready]
        if ready:
            if self.mode == "async":  # longest first; ties in task order
                ready.sort(key=lambda i: -self._estimate_ms(self._next_call(i)))
            return self.encoder.encode(self._write_call(ready[0]))
        unstated = [i for i in self.completed if not self.chains[i].stated]
        if unstated:
            chain = self.chains[unstated[0]]
            chain.stated = True
            return self.encoder.encode(self.subtasks[unstated[0]].sentence(chain.results) + "\n")
        if self._results_owed:
            return self.encoder.encode(self.prompt.TRAP_TEXT)
        return None

    @property
    def _results_owed(self) -> bool:
        """Calls are running whose results are not in (the user's follow-up is no result)."""
        return any(e.call_id != "user" for e in self.queue)

    def _next_call(self, i: int) -> str:
        chain = self.chains[i]
        return self.subtasks[i].call(chain.num_called, chain.results)

    def _write_call(self, i: int) -> str:
        call = self._next_call(i)
        call_id = f"t{len(self.calls) + 1}"
        self.calls.append(call)
        self.chains[i].num_called += 1
        self.chain_by_call_id[call_id] = i
        return self.prompt.call_text(call_id, call)

    def _write(self, token: int) -> None:
        if self.segments[-1].role != "model":
            self.segments.append(Segment("model", []))
        self.segments[-1].token_ids.append(token)

    # -- the serving system ------------------------------------------------------------------
    def _estimate_ms(self, call: str) -> int:
        return self.timing.estimate_ms_by_name[function_name(call)]

    def _on(self, event) -> None:
        cml = protocol.cml()
        if isinstance(event, cml.Call):
            chain = self.chain_by_call_id[event.call_id]
            value = self.registry.execute(event.call)  # at dispatch, in dispatch order: tools keep state
            arrival_ms = self.now_ms + self._estimate_ms(event.call)
            self.queue.append(_Event(arrival_ms, len(self.chain_by_call_id), event.call_id, value, chain))
            if self.mode == "sync-cml":
                self.now_ms = arrival_ms
        elif isinstance(event, cml.Trap):
            self.num_traps += 1
            self.now_ms = max(self.now_ms, min(e.arrival_ms for e in self.queue))
        elif isinstance(event, cml.Malformed):
            raise ValueError(f"{self.task.task_id}: the simulated model wrote malformed CML: {event}")

    def _inject(self) -> None:
        due = sorted((e for e in self.queue if e.arrival_ms <= self.now_ms), key=lambda e: (e.arrival_ms, e.seq))
        for event in due:
            self.queue.remove(event)
            text = self.prompt.interrupt_text(event.call_id, event.value)
            self.segments.append(Segment("user" if event.call_id == "user" else "interrupt", self.encoder.encode(text)))
            self.monitor.feed_text(text)
            chain = self.chains[event.chain]
            if event.call_id == "user":
                chain.known = True
                continue
            chain.results.append(parse_value(event.value))
            if chain.complete:
                self.completed.append(event.chain)
