"""The AsyncLM inferlet end to end on the tiny model, with this test as its client, and
``oven asynclm`` on the embedded model."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from harness import NUM_PAGES, assert_pools_full, messages

from oven.control.tokenizer import Tokenizer

ESTIMATES = {"slow": 300, "medium": 200, "quick": 100}
PARALLEL = [["quick(1)"], ["slow(2)"], ["medium(3)"]]


PROGRAMS = ["asynclm"]  # stored in the module's ControlLoop (the `loop` fixture, conftest.py)


class Tool(BaseHTTPRequestHandler):
    """A tool behind HTTP: answers a call with what it was asked."""

    def do_POST(self):  # noqa: N802 (http.server's naming)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        reply = f"http says {body['call']}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def tool_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Tool)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def loop_config(tool_server) -> dict:
    return dict(http_allow=f"127.0.0.1:{tool_server.server_port}")  # the allow-list names the port


class Client:
    """Answers the inferlet's calls the way a test wants; sees every trace event as it comes."""

    def __init__(self, loop, spec: dict, answer=None):
        self.loop, self.trace = loop, []
        base = {"task": "Do the things.", "functions": "slow(x), medium(x), quick(x)", "estimates_ms": ESTIMATES,
                "answer_tokens": 6, "max_tokens": 200, "report_context": True}
        self.inst = loop.launch("asynclm", [json.dumps({**base, **spec})])
        self.answer = answer or (lambda client, event: client.reply(event["id"], f"ok {event['call']}"))

    def reply(self, call_id: str, value: str, ok: bool = True) -> None:
        self.inst.inbox.push(json.dumps({"type": "result", "id": call_id, "value": value, "ok": ok}))

    def run(self, on_step=lambda client: None, timeout_s: float = 120) -> dict:
        def step() -> bool:
            for text in messages(self.loop, self.inst)[len(self.trace):]:
                event = json.loads(text)
                self.trace.append(event)
                if event["type"] == "call" and "via" not in event:  # HTTP calls are not ours to run
                    self.answer(self, event)
            on_step(self)
            return not self.inst.alive
        assert self.loop.run_until(step, timeout_s)
        assert self.inst.exit_code == 0, self.inst.error
        done = self.trace[-1]
        assert done["type"] == "done"
        return done

    def kinds(self, *kinds: str) -> list[tuple[str, str]]:
        return [(e["type"], e.get("id", "")) for e in self.trace if e["type"] in kinds]


def context_text(loop, done: dict) -> str:
    return Tokenizer(loop.info.tokenizer).decode(done["context"])


def assert_no_interrupt_inside_a_call(text: str) -> None:
    for block in re.findall(r"\[CALL\](.*?)\[END\]", text, flags=re.S):
        assert "[INTR]" not in block and "[CALL]" not in block


def test_async_writes_longest_first_dispatches_at_once_and_injects_in_completion_order(loop):
    held = []
    client = Client(loop, {"mode": "async", "plan": PARALLEL, "kv": "keep"},
                    answer=lambda c, e: held.append(e["id"]))

    def answer_in_reverse(c):  # once all three are out, answer the last one first
        if len(held) == 3:
            for call_id in reversed(held):
                c.reply(call_id, f"result of {call_id}")
            held.clear()
    done = client.run(answer_in_reverse)
    calls = [e for e in client.trace if e["type"] == "call"]
    assert [c["call"] for c in calls] == ["slow(2)", "medium(3)", "quick(1)"]  # LPT
    assert [c["id"] for c in calls] == ["t1", "t2", "t3"]
    # each call went out before the next block was written, i.e. while generation went on
    first_text_after = [i for i, e in enumerate(client.trace) if e["type"] == "call"]
    assert first_text_after == sorted(first_text_after) and first_text_after[-1] < len(client.trace) - 1
    assert client.kinds("intr") == [("intr", "t3"), ("intr", "t2"), ("intr", "t1")]
    text = context_text(loop, done)
    assert_no_interrupt_inside_a_call(text)
    assert text.index("[INTR] t3 [HEAD] result of t3 [END]") < text.index("[INTR] t1 [HEAD] result of t1 [END]")
    assert done["calls"] == done["interrupts"] == 3 and not done["unanswered"]  # (a trap depends on timing)
    assert_pools_full(loop)


@pytest.mark.parametrize("mode, order", [
    ("sync", [("call", "t1"), ("intr", "t1"), ("call", "t2"), ("intr", "t2"), ("call", "t3"), ("intr", "t3")]),
    ("sync-parallel", [("call", "t1"), ("call", "t2"), ("call", "t3"), ("intr", "t1"), ("intr", "t2"),
                       ("intr", "t3")]),
])
def test_sync_modes_wait_as_their_baselines_do(loop, mode, order):
    client = Client(loop, {"mode": mode, "plan": PARALLEL})
    done = client.run()
    assert client.kinds("call", "intr") == order
    assert done["decisions"] == {"keep": 3 if mode == "sync" else 1}
    assert_no_interrupt_inside_a_call(context_text(loop, done))


@pytest.mark.parametrize("estimates", [ESTIMATES, {name: ms + 0.375 for name, ms in ESTIMATES.items()}],
                         ids=["whole-ms", "fractional-ms"])
def test_auto_hands_the_wait_to_the_servers_interception_policy(loop, estimates):
    """Under kv=auto the trap handler decides nothing itself: it tells the server how long the wait
    should last (a pause hint, which the server holds while the instance waits) and the server's
    interception policy places the KV. Estimates may be fractional (the latency bench's are): the
    trap while such a call is in flight once ended the instance with a wasm trap."""
    hinted, answered = [], set()

    def answer_once_hinted(c):
        kv = [e for e in c.trace if e["type"] == "kv"]
        if len(kv) == len(hinted) or not c.inst.io_idle:
            return  # not waiting yet, or this wait's calls are already answered
        hinted.append(c.inst.pause_until is not None)
        for event in c.trace:
            if event["type"] == "call" and event["id"] not in answered:
                answered.add(event["id"])
                c.reply(event["id"], f"value-{event['id']}")
    client = Client(loop, {"mode": "async", "plan": [["quick(1)", "medium(2)"]], "estimates_ms": estimates},
                    answer=lambda c, e: None)
    done = client.run(answer_once_hinted)
    assert (done["decisions"], done["kv_page_ms_saved"], hinted) == ({"pool": 2}, 0, [True, True])
    assert_pools_full(loop)


def test_keep_offload_and_drop_resume_to_the_same_continuation_and_free_device_pages(loop):
    """A dependent chain forces a trap; while the model waits, offload/drop hold no device page."""
    results = {}
    for policy in ("keep", "offload", "drop"):
        seen = {}

        def answer_once_waiting(c, seen=seen):
            """Answer the calls out only while the model waits at a trap (one kv event per wait)."""
            kv = [e for e in c.trace if e["type"] == "kv"]
            if len(kv) == len(seen.setdefault("free", [])):
                return  # not waiting yet, or this wait's calls are already answered
            if policy != "keep" and loop.replicas[0].kv_pool.num_free != NUM_PAGES:
                return  # the offload (or the dealloc) has not landed yet
            seen["free"].append((loop.replicas[0].kv_pool.num_free, loop.replicas[0].host_pool.num_free, kv[-1]["pages"]))
            for event in c.trace:
                if event["type"] == "call" and event["id"] not in seen.setdefault("answered", set()):
                    seen["answered"].add(event["id"])
                    c.reply(event["id"], f"value-{event['id']}")
        client = Client(loop, {"mode": "async", "plan": [["quick(1)", "medium(2)"]], "kv": policy},
                        answer=lambda c, e: None)
        done = client.run(answer_once_waiting)
        assert len(seen["free"]) == 2
        for free_device, free_host, pages in seen["free"]:
            assert pages > 0
            assert free_device == {"keep": NUM_PAGES - pages, "offload": NUM_PAGES, "drop": NUM_PAGES}[policy]
            assert free_host == loop.info.num_host_pages - (pages if policy == "offload" else 0)
        assert done["decisions"] == {policy: 2}
        if policy == "keep":
            assert done["kv_page_ms_saved"] == 0
        results[policy] = (done["context"], [e["text"] for e in client.trace if e["type"] == "text"])
        assert_pools_full(loop)
    assert results["keep"] == results["offload"] == results["drop"]


def test_user_messages_and_timeouts_become_interrupts(loop):
    client = Client(loop, {"mode": "async", "plan": [["slow(1)"]], "call_timeout_ms": 300, "kv": "keep"},
                    answer=lambda c, e: c.inst.inbox.push(json.dumps({"type": "user", "text": "also say hi"})))
    done = client.run()
    intrs = {e["id"]: e["value"] for e in client.trace if e["type"] == "intr"}
    assert intrs == {"user": "also say hi", "t1": "error: timeout after 300 ms"}
    text = context_text(loop, done)
    assert "[INTR] user [HEAD] also say hi [END]" in text
    assert_no_interrupt_inside_a_call(text)


def test_bad_client_messages_are_reported_and_plain_text_is_a_user_interrupt(loop):
    def answer(c, e):
        for text in ('{"type": "mystery"}', '{"type": "result"}', "plain words"):
            c.inst.inbox.push(text)
        c.reply(e["id"], "fine")
    client = Client(loop, {"mode": "async", "plan": [["quick(1)"]], "kv": "keep"}, answer=answer)
    done = client.run()
    errors = [e["error"] for e in client.trace if e["type"] == "error"]
    assert len(errors) == 2 and "unknown message type 'mystery'" in errors[0] and "'id'" in errors[1]
    assert {e["id"]: e["value"] for e in client.trace if e["type"] == "intr"} == {"user": "plain words", "t1": "fine"}
    assert done["interrupts"] == 2


def test_calls_over_http(loop, tool_server):
    client = Client(loop, {"mode": "async", "plan": PARALLEL[:2], "kv": "keep",
                           "http_url": f"http://127.0.0.1:{tool_server.server_port}/call"},
                    answer=lambda c, e: pytest.fail("a call went over messages"))
    done = client.run()
    assert all(e.get("via") == "http" for e in client.trace if e["type"] == "call")
    assert sorted(e["value"] for e in client.trace if e["type"] == "intr") == ["http says quick(1)",
                                                                               "http says slow(2)"]
    assert done["interrupts"] == 2


def oven_asynclm(*flags: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "oven.client.cli", "asynclm", *flags], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


def test_oven_asynclm_writes_its_own_calls_on_the_adapter():
    """The README's main job on SmolLM2 and the `asynclm` adapter, no plan: the model writes calls to
    the demo tools itself, and each one's result comes back as its interrupt. (What the committed
    adapter gets right beyond that is measured by `oven.client.asynclm.training.check`, not here.)"""
    proc = oven_asynclm()
    assert "(the model writes its calls; adapter asynclm)" in proc.stdout
    calls = re.findall(r"⇢ call (\w+): (get_weather|get_stock_price|convert_currency|calculate)\(", proc.stdout)
    interrupts = re.findall(r"⇠ interrupt (\w+): ", proc.stdout)
    assert calls, proc.stdout
    assert sorted(interrupts) == sorted(call_id for call_id, _ in calls)
    assert re.search(rf"tokens \d+ \(0 pinned by the plan\), calls {len(calls)}, interrupts {len(calls)}",
                     proc.stdout), proc.stdout


def test_an_empty_task_is_refused():
    proc = subprocess.run([sys.executable, "-m", "oven.client.cli", "asynclm", " "], capture_output=True, text=True,
                          timeout=120)
    assert (proc.returncode, proc.stderr) == (2, "oven: TASK is empty: give a task, or leave it out for the demo's\n")


def test_oven_asynclm_with_a_plan_on_the_base_model():
    """--plan pins the demo's three calls (the latency benchmarks' setting), --no-adapter runs the base model."""
    proc = oven_asynclm("--plan", "--no-adapter", "--answer-tokens", "8")
    assert "(the calls are pinned (--plan); the base model (--no-adapter))" in proc.stdout
    assert proc.stdout.count("⇢ call") == 3 and proc.stdout.count("⇠ interrupt") == 3
    assert re.search(r"calls 3, interrupts 3", proc.stdout)
