"""Prometheus metrics: the control process's registry (control/metrics.py) read through ``/metrics`` on
the OpenAI port and through ``oven serve --metrics-port``, parsed by prometheus_client's own parser;
its counters move as a completion runs. The request histograms' meaning is checked on a given clock."""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections import Counter

import openai
import pytest
from harness import OVEN, Server
from prometheus_client.parser import text_string_to_metric_families

from oven.control.metrics import ControlMetrics
from oven.control.runtime.snapshot import LoopSnapshot
from oven.control.scheduling.batcher import SchedulerStats

MODEL = "tiny"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def get(url: str, key: str | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """Every sample of an exposition: (name, sorted labels) -> value."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def family_types(text: str) -> dict[str, str]:
    return {family.name: family.type for family in text_string_to_metric_families(text)}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(server, OpenAI base URL, --metrics-port URL)."""
    api_port, metrics_port = free_port(), free_port()
    server = Server(tmp_path_factory.mktemp("metrics"), "--openai-port", str(api_port), "--metrics-port",
                    str(metrics_port), programs=("chat-completion",))
    base = f"http://127.0.0.1:{api_port}"
    try:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key=server.operator_token, max_retries=0)
        for _ in range(600):  # the front end publishes its inferlet first
            try:
                client.models.list()
                break
            except openai.APIConnectionError:
                time.sleep(0.2)
        yield server, base, f"http://127.0.0.1:{metrics_port}/metrics"
    finally:
        server.stop()


def test_metrics_need_a_key_and_parse(served):
    server, base, _ = served
    assert get(f"{base}/metrics")[0] == 401
    status, text = get(f"{base}/metrics", server.operator_token)
    assert status == 200
    types = family_types(text)
    expected = {"oven:num_requests_running": "gauge", "oven:instances": "gauge", "oven:requests": "counter",
                "oven:kv_pages": "gauge", "oven:generation_tokens": "counter", "oven:batches": "counter",
                "oven:batch_size": "histogram", "oven:device_time_seconds": "counter",
                "oven:split_forwards": "counter", "oven:prefill_chunks": "counter",
                "oven:interceptions": "counter", "oven:preemptions": "counter", "oven:adapter_requests": "counter",
                "oven:inference_restarts": "counter", "oven:request_queue_time_seconds": "histogram",
                "oven:time_to_first_token_seconds": "histogram", "oven:time_per_output_token_seconds": "histogram",
                "oven:e2e_request_latency_seconds": "histogram", "oven:http_requests": "counter",
                "oven:http_request_duration_seconds": "histogram"}
    assert {name: types.get(name) for name in expected} == expected


def test_counters_move_as_a_completion_runs(served):
    """One completion of 8 tokens: one more request ended, 8 more outputs, more batches and device time,
    one more time-to-first-token and 7 more time-per-output-token observations, and the front end
    counted the request by route and status."""
    server, base, _ = served
    before = samples(get(f"{base}/metrics", server.operator_token)[1])
    api = openai.OpenAI(base_url=f"{base}/v1", api_key=server.operator_token, max_retries=0)
    assert api.completions.create(model=MODEL, prompt="Name three colours.", max_tokens=8,
                                  temperature=0).usage.completion_tokens == 8
    after = samples(get(f"{base}/metrics", server.operator_token)[1])

    def moved(name: str, **labels) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after[key] - before.get(key, 0.0)

    assert moved("oven:requests_total", state="finished") == 1
    assert moved("oven:generation_tokens_total") == 8
    assert moved("oven:time_to_first_token_seconds_count") == 1
    assert moved("oven:time_per_output_token_seconds_count") == 7
    assert moved("oven:request_queue_time_seconds_count") == 1
    assert moved("oven:e2e_request_latency_seconds_count") == 1
    assert moved("oven:batches_total") >= 8 and moved("oven:batch_size_count") == moved("oven:batches_total")
    assert moved("oven:device_time_seconds_total") > 0
    assert moved("oven:http_requests_total", route="/v1/completions", method="POST", status="200") == 1
    assert after[("oven:kv_pages", (("state", "used"),))] == 0  # the instance ended: its pages are back
    assert after[("oven:num_requests_running", ())] == 0


def test_the_metrics_port_serves_the_control_families(served):
    server, base, metrics_url = served
    status, text = get(metrics_url)
    assert status == 200
    on_api = family_types(get(f"{base}/metrics", server.operator_token)[1])
    control = {name: kind for name, kind in on_api.items() if not name.startswith("oven:http_")}
    assert family_types(text) == control
    with server.client() as client:
        assert family_types(client.metrics()) == control


def test_a_metrics_port_in_use_fails_at_start_in_one_line(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = subprocess.run([*OVEN, "serve", "--model", MODEL, "--state-dir", str(tmp_path / "state"),
                               "--control-endpoint", f"ipc://{tmp_path / 'control.sock'}", "--metrics-port",
                               str(port)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr == f"oven: cannot serve metrics on http://127.0.0.1:{port}/metrics: the address is in use\n"


def test_request_histograms_on_a_given_clock():
    """Queue time: launch to the first batch holding a call of it; time to first token: launch to its
    first output; time per output token: between later batches giving it output (outputs of one batch,
    forked choices, count once); end-to-end: launch to end. Each instance on its own."""
    snapshot = LoopSnapshot((), (), (), SchedulerStats(3, 7, 0, 0, ((1, 1), (2, 1), (4, 1))), 10, 0, 4)
    metrics = ControlMetrics(lambda: snapshot, 12, 4, Counter({"asynclm": 2}))
    metrics.launched("a", 10.0)
    metrics.launched("b", 10.5)
    metrics.batch_sent(iter(["a"]), 10.25)
    metrics.batch_sent(iter(["a", "b"]), 11.0)  # a's second batch: no second queue time
    for instance_id, now in (("a", 11.0), ("b", 12.0), ("a", 11.5), ("a", 11.5), ("a", 12.5)):
        metrics.output(instance_id, now)
    metrics.ended("a", "finished", 10.0, 13.0)
    found = samples(metrics.render().decode())
    assert {name: (found[(f"oven:{name}_count", ())], found[(f"oven:{name}_sum", ())])
            for name in ("request_queue_time_seconds", "time_to_first_token_seconds",
                         "time_per_output_token_seconds", "e2e_request_latency_seconds")} == {
        "request_queue_time_seconds": (2, 0.25 + 0.5), "time_to_first_token_seconds": (2, 1.0 + 1.5),
        "time_per_output_token_seconds": (2, 0.5 + 1.0), "e2e_request_latency_seconds": (1, 3.0)}
    assert found[("oven:generation_tokens_total", ())] == 5
    assert found[("oven:requests_total", (("state", "finished"),))] == 1
    assert [found[("oven:kv_pages", (("state", s),))] for s in ("used", "free", "swapped")] == [2, 10, 0]
    assert [found[("oven:batch_size_bucket", (("le", le),))] for le in ("1.0", "2.0", "4.0", "8.0", "+Inf")] \
        == [1, 2, 3, 3, 3]
    assert (found[("oven:batch_size_count", ())], found[("oven:batch_size_sum", ())]) == (3, 7)
    assert found[("oven:adapter_requests_total", (("adapter", "asynclm"),))] == 2
