"""``oven asynclm``: run the AsyncLM inferlet, execute the calls it makes, show its stream.

The inferlet (inferlets/asynclm) decodes and sends each call the moment it is written; this
client runs the calls concurrently on a :class:`ToolExecutor` and sends every result back
as a message, which the inferlet injects as an interrupt. Everything the inferlet does
comes back as JSON trace events, printed live and summed up at the end.
"""

from __future__ import annotations

import json
import queue
import sys
import threading
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Callable

from ..rpc import OvenClient
from .tools import ToolExecutor, ToolRegistry, demo_registry, load_scenarios
from .tools.call_grammar import call_grammar, registry_schemas
from .tools.sources import open_tools

DEMO_TASK = "What is the weather in Paris and in Tokyo, and what is 250 USD in EUR?"
DEMO_PLAN = [['get_weather(city="Paris")'], ['get_weather(city="Tokyo")'],
             ['convert_currency(amount=250, from_currency="USD", to_currency="EUR")']]


@dataclass
class Workload:
    """A task, the tools that serve it, and optionally its pinned calls (chains of dependent calls)."""

    name: str
    task: str
    registry: ToolRegistry
    plan: list[list[str]] | None = None
    latency: Callable[[str], float] | None = None  # emulated execution time of a call, seconds
    resources: ExitStack = field(default_factory=ExitStack)  # what its tools hold open (MCP sessions)

    def estimates_ms(self) -> dict[str, float]:
        return {tool.name: tool.latency_ms for tool in self.registry}

    def __enter__(self) -> Workload:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.resources.close()


def demo_workload(task: str | None, plan: bool) -> Workload:
    """The demo tools on ``task`` (default: the demo task); ``plan`` pins the demo task's calls."""
    registry = demo_registry()
    return Workload("demo", task or DEMO_TASK, registry, DEMO_PLAN if plan and not task else None,
                    registry.latency_s)


def tools_workload(specs: list[str], task: str | None) -> Workload:
    """A user's own tools (``--tools`` values: files, MCP servers; see :mod:`.tools.sources`) on ``task``.
    They run with their real latencies; the workload keeps its MCP sessions open until it is closed
    (``with workload:``). Raises as :func:`~.tools.sources.open_tools` does."""
    with ExitStack() as resources:
        registry = open_tools(specs, resources)
        return Workload(", ".join(specs), task or "", registry, resources=resources.pop_all())


def bfcl_workload(kind: str, sample: int, seed: int = 0) -> Workload:
    """BFCL sample number ``sample`` of ``kind``, with a fresh registry (multi-turn tools keep state)."""
    scenario = load_scenarios(kind, limit=sample + 1, seed=seed)[sample]
    registry = scenario.build_registry()
    return Workload(scenario.id, scenario.question, registry, scenario.chains, registry.latency_s)


def session_spec(workload: Workload, mode: str, constrain: bool = False, **options) -> dict:
    """The inferlet's argument (see inferlets/asynclm/app.py); ``options`` set to None are left out
    (``adapter``: the LoRA adapter's name; without one the inferlet runs the base model). ``constrain``
    holds the model's calls to the workload's tools: their names, argument names and value types
    (:func:`~.tools.call_grammar.call_grammar`)."""
    spec = {"task": workload.task, "mode": mode, "functions": workload.registry.describe(),
            "estimates_ms": workload.estimates_ms()}
    if constrain:
        spec["call_grammar"] = call_grammar(registry_schemas(workload.registry))
    if workload.plan:
        spec["plan"] = workload.plan
    spec.update({k: v for k, v in options.items() if v is not None})
    return spec


@dataclass
class Session:
    instance_id: str
    trace: list[dict] = field(default_factory=list)
    exit_code: int | None = None
    error: str = ""
    timings: list = field(default_factory=list)  # the executor's per-call CallTiming

    @property
    def summary(self) -> dict:
        return next((e for e in reversed(self.trace) if e.get("type") == "done"), {})

    @property
    def calls(self) -> list[str]:
        """The calls the model made, as written."""
        return [e["call"] for e in self.trace if e.get("type") == "call"]

    @property
    def text(self) -> str:
        """What the model wrote outside CML."""
        return "".join(e["text"] for e in self.trace if e.get("type") == "text")


def run_session(client: OvenClient, program: str, workload: Workload, spec: dict,
                on_event: Callable[[dict], None] = lambda e: None, timeout_s: float = 60.0,
                results: queue.Queue | None = None) -> Session:
    """Launch the inferlet with ``spec``, execute its calls until it exits; the whole trace.

    ``results`` carries messages for the instance from other threads (the executor's answers,
    a user's interrupts): only this thread may use the client's socket.
    """
    results = results or queue.Queue()

    def answered(call_id: str, value: str, ok: bool) -> None:
        results.put({"type": "result", "id": call_id, "value": value, "ok": ok})

    with ToolExecutor(workload.registry, timeout_s=timeout_s, latency=workload.latency) as executor:
        session = Session(client.launch(program, [json.dumps(spec)]))
        with client.ending_with_caller(session.instance_id):
            for event in client.events(poll_s=0.002):
                while not results.empty():
                    client.send(session.instance_id, json.dumps(results.get()))
                if event is None or event.instance_id != session.instance_id:
                    continue
                if event.kind == "message":
                    message = json.loads(event.text)
                    session.trace.append(message)
                    if message["type"] == "call" and "via" not in message:
                        executor.submit(message["id"], message["call"], answered)
                    on_event(message)
                elif event.kind in ("stdout", "stderr"):
                    sys.stderr.write(event.text)
                elif event.kind == "exit":
                    session.exit_code, session.error = event.exit_code, event.text
                    break
        session.timings = executor.timings()
    return session


def read_user_interrupts(into: queue.Queue) -> None:
    """Lines typed on stdin go to the instance as user interrupts (a daemon thread)."""
    def read() -> None:
        for line in sys.stdin:
            if line.strip():
                into.put({"type": "user", "text": line.strip()})
    threading.Thread(target=read, daemon=True, name="stdin").start()


INTERRUPT_SHOWN_CHARS = 100  # of a result on its interrupt line (the model reads all of it)


def clipped(text: str, limit: int = INTERRUPT_SHOWN_CHARS) -> str:
    """``text``, or its first ``limit`` characters, "…" and how many were left out."""
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text) - limit} more characters)"


class StreamPrinter:
    """Model text inline; calls, interrupts, traps and KV decisions on lines of their own."""

    def __init__(self, out=sys.stdout):
        self.out = out
        color = out.isatty()
        self.dim = (lambda s: f"\033[2m{s}\033[0m") if color else (lambda s: s)
        self.mark = (lambda s: f"\033[1;36m{s}\033[0m") if color else (lambda s: s)

    def __call__(self, e: dict) -> None:
        kind = e["type"]
        if kind == "text":
            self.out.write(e["text"])
        elif kind == "call":
            self.out.write("\n" + self.mark(f"  ⇢ call {e['id']}: {e['call']}") + "\n")
        elif kind == "intr":
            self.out.write("\n" + self.mark(f"  ⇠ interrupt {e['id']}: {clipped(e['value'])}") + "\n")
        elif kind == "trap":
            self.out.write("\n" + self.mark(f"  ⧖ trap: waiting for {', '.join(e['waiting'])}") + "\n")
        elif kind == "kv":
            self.out.write(self.dim(f"  ▣ kv cache {e['decision']}: {e['tokens']} tokens in {e['pages']} pages, "
                                    f"expected wait {e['expected_wait_ms']} ms") + "\n")
        elif kind in ("malformed", "error"):
            self.out.write(self.dim(f"  ! {kind}: {e.get('reason') or e.get('error')} {e.get('text', '')}") + "\n")
        self.out.flush()


def summary_lines(summary: dict) -> list[str]:
    decisions = ", ".join(f"{k} {v}" for k, v in sorted(summary.get("decisions", {}).items())) or "none"
    return [
        f"tokens {summary['tokens']} ({summary['forced']} pinned by the plan), calls {summary['calls']}, "
        f"interrupts {summary['interrupts']}, traps {summary['traps']}",
        f"wall {summary['wall_ms']} ms: decoding {summary['generation_ms']} ms, waiting {summary['wait_ms']} ms; "
        f"decoding overlapped with running calls for {summary['overlap_ms']} ms",
        f"kv cache while waiting: {decisions}; {summary['kv_page_ms_saved']} page-ms freed",
    ]
