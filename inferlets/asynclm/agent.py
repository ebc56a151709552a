"""One AsyncLM session: the decode loop that ties the token monitor, executor, interrupt
manager and trap handler together (AsyncLM §5), in one of four modes:

* ``async``: a call goes out the moment its ``[END]`` is sampled and decoding goes on;
  results are injected as interrupts into the same KV context; ``[TRAP][END]`` waits;
* ``async-naive``: the same, but every injection re-prefills the whole context, as a
  client of a chat-completion API must (a new request per interrupt);
* ``sync``: decoding stops after every call until its result is in;
* ``sync-parallel``: calls are collected and sent together at ``[TRAP][END]``, then all awaited.

``stateless`` makes the sync modes re-prefill the context after every wait, as the paper's
baselines over a serving API do.

With a ``call_grammar`` (``oven asynclm --constrain``: the tools' schemas as a Lark grammar of what
follows a call's ``[HEAD]``), every call is named and the text after its ``[HEAD]`` is one
generation the server draws under that grammar (greedy, pipelined), up to its ``[END]``: a call of
one of the tools, with their argument names and value types. Without one, nothing changes.
"""

from __future__ import annotations

import json

import inferlet
from calls import Calls
from cml import Call, Malformed, Text, TokenMonitor, Trap
from interrupts import Interrupts
from plan import Plan
from prompt import TRAP_TEXT, interrupt_text, system_prompt
from traps import TrapHandler

MODES = ("async", "async-naive", "sync", "sync-parallel")
TOP_K = 64  # candidates the monitor may choose among when it must refuse the best ones


def report(event: dict) -> None:
    """A trace event for the client, stamped with the instance's clock (ms)."""
    inferlet.send(json.dumps({**event, "t": inferlet.now_ms()}))


class Agent:
    def __init__(self, spec: dict):
        self.mode = spec.get("mode", "async")
        if self.mode not in MODES:
            raise ValueError(f"mode {self.mode!r} is not one of {', '.join(MODES)}")
        self.stateless = bool(spec.get("stateless")) and self.mode.startswith("sync")
        self.max_tokens = int(spec.get("max_tokens", 256))
        self.answer_tokens = int(spec.get("answer_tokens", 48))
        self.report_context = bool(spec.get("report_context"))
        estimates = spec.get("estimates_ms", {})
        estimate_ms = lambda call: estimates.get(call.split("(", 1)[0].strip(), 100)  # noqa: E731

        # The fine-tuned CML adapter, by the name the server offers it under (spec "adapter"); none: the base model.
        self.ctx = inferlet.Context(adapter=inferlet.open_adapter(spec["adapter"]) if spec.get("adapter") else 0)
        # --constrain: the grammar of a call's text after [HEAD] (checked by the server here, once)
        self.call_shape = inferlet.Shape(grammar=inferlet.Grammar("lark", spec["call_grammar"])) \
            if spec.get("call_grammar") else None
        self.monitor = TokenMonitor(lambda token: inferlet.decode([token]), named_calls=self.call_shape is not None)
        self.interrupts = Interrupts()
        self.calls = Calls(self.interrupts, estimate_ms, int(spec.get("call_timeout_ms", 30000)),
                           spec.get("http_url"))
        self.plan = Plan(spec["plan"], self.mode, estimate_ms) if spec.get("plan") else None
        self.traps = TrapHandler(spec.get("kv", "auto"), report)
        self.end_tokens = inferlet.stop_tokens()
        self.forced: list[int] = []
        self.batch: list[tuple[str, str]] = []  # sync-parallel: calls written, sent at the trap
        self.stats = dict(tokens=0, forced=0, calls=0, interrupts=0, traps=0, generation_ms=0, overlap_ms=0,
                          wait_ms=0, decisions={})
        self._anonymous = 0

        cheat_sheet = [c for chain in spec.get("plan") or [] for c in chain]
        system = system_prompt(spec.get("functions", ""), cheat_sheet, example=bool(spec.get("example")))
        self.ctx.fill_chat([{"role": "system", "content": system},
                            {"role": "user", "content": spec["task"]}])

    # -- the loop -----------------------------------------------------------------------------
    async def run(self) -> dict:
        started = inferlet.now_ms()
        inferlet.spawn(self._listen())
        answering = 0
        while self.stats["tokens"] - self.stats["forced"] < self.max_tokens:  # pinned tokens are not the model's
            if self.monitor.interruptible:
                self._inject()
            if self.plan and not self.forced and not self.monitor.in_critical_section:
                text = self.plan.next_text()
                self.forced = inferlet.encode(text) if text else []
            if self.plan and not self.forced and self.plan.done():
                answering += 1
                if answering > self.answer_tokens:
                    break
            if self.call_shape is not None and not self.forced and self.monitor.call_body_start:
                tokens = await self._held_call()
            else:
                token = await self._step()
                tokens = [] if token is None else [token]
            if not tokens:
                break
            for token in tokens:
                for event in self.monitor.feed(token):
                    await self._on(event)
        for event in self.monitor.flush():
            await self._on(event)
        self.stats.update(wall_ms=inferlet.now_ms() - started, dispatched=self.calls.dispatched,
                          plan_complete=self.plan.done() if self.plan else None,
                          unanswered=sorted(self.calls.in_flight), kv_page_ms_saved=self.traps.page_ms_saved)
        if self.report_context:  # for tests: the exact token sequence the model saw
            self.stats["context"] = self.ctx.tokens + self.ctx.pending
        return self.stats

    async def _timed(self, generation):
        """What ``generation`` (the model at work) gives; its time counts as generation, and as overlap
        where calls were in flight when it began."""
        in_flight = bool(self.calls.in_flight)
        before = inferlet.now_ms()
        result = await generation
        took = inferlet.now_ms() - before
        self.stats["generation_ms"] += took
        if in_flight:
            self.stats["overlap_ms"] += took
        return result

    async def _step(self) -> int | None:
        """One decode step: forward the pending tokens, then take the forced token or choose one."""
        dist = await self._timed(self.ctx.next_dist(TOP_K))
        if self.forced:
            token = self.forced.pop(0)
            self.stats["forced"] += 1
        else:
            token = self._choose(dist.token_ids)
            if token is None:
                return None
        self.ctx.fill_tokens([token])
        self.stats["tokens"] += 1
        return token

    async def _held_call(self) -> list[int]:
        """A call's text after its ``[HEAD]``, up to its ``[END]``, drawn under the call grammar."""
        budget = self.max_tokens - (self.stats["tokens"] - self.stats["forced"])
        stop = inferlet.Stop(max_tokens=budget, strings=("[END]",))
        tokens = await self._timed(self.ctx.generate_tokens(inferlet.Greedy(), stop, self.call_shape))
        self.stats["tokens"] += len(tokens)
        return tokens

    def _choose(self, ranked: list[int]) -> int | None:
        """The best token the monitor allows; an end token while results are owed becomes a trap."""
        owed = bool(self.calls.in_flight or self.batch or (self.plan and not self.plan.done()))
        answering = self.plan is not None and self.plan.done()
        for token in ranked:
            if token in self.end_tokens:
                if self.monitor.in_critical_section:
                    continue
                if owed:  # the model wants to stop but results are still coming: it waits instead
                    self.forced = inferlet.encode(TRAP_TEXT)
                    return self.forced.pop(0)
                return None
            if answering and "[" in self.monitor.text_of(token):  # a pinned plan makes no further calls
                continue
            if self.monitor.allowed(token):
                return token
        return None

    # -- events -------------------------------------------------------------------------------
    async def _on(self, event) -> None:
        if isinstance(event, Text):
            report({"type": "text", "text": event.text})
        elif isinstance(event, Malformed):
            report({"type": "malformed", "text": event.text, "reason": event.reason})
        elif isinstance(event, Call):
            await self._on_call(event)
        elif isinstance(event, Trap):
            await self._on_trap()

    async def _on_call(self, call: Call) -> None:
        call_id = call.call_id
        if call_id is None:  # anonymous: run it, but no interrupt will name it
            self._anonymous += 1
            call_id = f"_anonymous{self._anonymous}"
        self.stats["calls"] += 1
        if self.mode == "sync-parallel":
            self.batch.append((call_id, call.call))
            return
        self.calls.dispatch(call_id, call.call)
        if self.mode == "sync":
            await self._wait_all()

    async def _on_trap(self) -> None:
        self.stats["traps"] += 1
        if self.mode == "sync-parallel":
            for call_id, call in self.batch:
                self.calls.dispatch(call_id, call)
            self.batch = []
            await self._wait_all()
        elif self.calls.in_flight:
            report({"type": "trap", "waiting": sorted(self.calls.in_flight)})
            policy = "drop" if self.mode == "async-naive" else None
            await self._wait(self.interrupts.arrival, policy)

    async def _wait_all(self) -> None:
        async def all_answered():
            while self.calls.in_flight:
                await self.interrupts.arrival(new=True)
        await self._wait(all_answered, "drop" if self.stateless else "keep")

    async def _wait(self, until, policy: str | None) -> None:
        before = inferlet.now_ms()
        decision = await self.traps.wait(self.ctx, until, self.calls.expected_wait_ms(), policy)
        self.stats["wait_ms"] += inferlet.now_ms() - before
        self.stats["decisions"][decision] = self.stats["decisions"].get(decision, 0) + 1

    # -- interrupts ---------------------------------------------------------------------------
    def _inject(self) -> None:
        arrived = [(i, v) for i, v in self.interrupts.take() if not i.startswith("_anonymous")]
        if not arrived:
            return
        if self.mode == "async-naive" or self.stateless:
            self.ctx.evict()  # a new request: the whole context is prefilled again
        for call_id, value in arrived:
            text = interrupt_text(call_id, value)
            self.ctx.fill(text)
            self.monitor.feed_text(text)
            if self.plan:
                self.plan.answered(call_id)
            self.stats["interrupts"] += 1
            report({"type": "intr", "id": call_id, "value": value})

    async def _listen(self) -> None:
        """Client messages: call results, and user messages, which become interrupts too (§6.6).

        A message that is not JSON is a user's text (what `oven send ID TEXT` sends)."""
        while True:
            text = await inferlet.receive()
            try:
                message = json.loads(text)
            except ValueError:
                message = {"type": "user", "text": text}
            try:
                kind = message["type"]
                if kind == "result":
                    self.calls.answer(message["id"], str(message["value"]), bool(message.get("ok", True)))
                elif kind == "user":
                    self.interrupts.push("user", str(message["text"]))
                else:
                    raise ValueError(f"unknown message type {kind!r}")
            except (ValueError, KeyError, TypeError) as exc:
                report({"type": "error", "error": f"bad client message {text[:80]!r}: {exc}"})
