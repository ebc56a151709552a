"""The control process's Prometheus metrics (``oven:`` names, labels as vLLM's).

One :class:`ControlMetrics` per control loop owns a ``CollectorRegistry``. The loop is one thread
and runs per token, so what is observed there stays small: a histogram observation per instance
event (its first batch, its first output, each later batch that gives it output, its exit) and
plain integer counts. Everything else (instances by state, KvPages, batches and their sizes, device
time, interceptions, preemptions, adapter use) is read from the loop's snapshot when the
registry is collected, which happens on the loop thread (``MetricsRequest``, :mod:`.metrics_http`).

What the request metrics mean for an inferlet, which is a program rather than one prompt:

* **queue time** (``oven:request_queue_time_seconds``): from its launch until the first batch that
  holds one of its calls is sent to the inference process;
* **time to first token** (``oven:time_to_first_token_seconds``): from its launch until its first
  output (a sampled token, or the distribution it samples from) comes back;
* **time per output token** (``oven:time_per_output_token_seconds``): between two later batches that
  give it output (the choices of one instance decoding in one batch count once);
* **end-to-end latency** (``oven:e2e_request_latency_seconds``): from its launch until it ends.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from oven.control.runtime.snapshot import LoopSnapshot

# Seconds, as vLLM's buckets for the same series (its TTFT and TPOT histograms), a little extended.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0)
TPOT_BUCKETS = (0.001, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                0.75, 1.0, 2.5, 5.0, 10.0)
LATENCY_BUCKETS = (0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                   60.0, 120.0, 240.0, 480.0, 960.0)
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)


class ControlMetrics:
    """The registry and the loop's hooks into it.

    ``snapshot`` is the loop's (read at collection); ``num_kv_pages`` and ``num_host_pages`` are the
    pools' sizes, every replica's together; ``adapter_uses`` counts opens by adapter name."""

    def __init__(self, snapshot: Callable[[], LoopSnapshot], num_kv_pages: int, num_host_pages: int,
                 adapter_uses: Counter[str]):
        self.registry = CollectorRegistry()
        self._snapshot, self._num_kv_pages, self._num_host_pages = snapshot, num_kv_pages, num_host_pages
        self._adapter_uses = adapter_uses
        histogram = dict(registry=self.registry)
        self.queue_time = Histogram("oven:request_queue_time_seconds", "Launch of an instance to the first batch "
                                    "holding one of its calls.", buckets=LATENCY_BUCKETS, **histogram)
        self.ttft = Histogram("oven:time_to_first_token_seconds", "Launch of an instance to its first output "
                              "(a sampled token or a distribution).", buckets=TTFT_BUCKETS, **histogram)
        self.tpot = Histogram("oven:time_per_output_token_seconds", "Between two later batches that give an "
                              "instance output.", buckets=TPOT_BUCKETS, **histogram)
        self.e2e = Histogram("oven:e2e_request_latency_seconds", "Launch of an instance to its end.",
                             buckets=LATENCY_BUCKETS, **histogram)
        self.num_output_tokens = 0
        self.num_ended: Counter[str] = Counter()  # by the state it ended in
        self.num_inference_restarts = 0
        self._launched_at: dict[str, float] = {}  # instances with no call sent yet
        self._first_output_due: dict[str, float] = {}  # and with no output yet: when they launched
        self._last_output_at: dict[str, float] = {}
        self.registry.register(_SnapshotCollector(self))
        self.registry.register(ProcessCollector(namespace="oven", registry=None))

    # -- the loop's hooks ----------------------------------------------------------------------

    def launched(self, instance_id: str, now: float) -> None:
        self._launched_at[instance_id] = self._first_output_due[instance_id] = now

    def batch_sent(self, instance_ids: Iterator[str], now: float) -> None:
        """A batch holding calls of ``instance_ids`` went out: the queue time of those in their first."""
        if self._launched_at:
            for instance_id in instance_ids:
                if (launched := self._launched_at.pop(instance_id, None)) is not None:
                    self.queue_time.observe(now - launched)

    def output(self, instance_id: str, now: float) -> None:
        """One output (a token or a distribution) of ``instance_id`` settled at ``now``."""
        self.num_output_tokens += 1
        last = self._last_output_at.get(instance_id)
        if last is None:
            if (launched := self._first_output_due.pop(instance_id, None)) is not None:
                self.ttft.observe(now - launched)
        elif last != now:  # several outputs of one batch (forked choices) count as one step
            self.tpot.observe(now - last)
        self._last_output_at[instance_id] = now

    def ended(self, instance_id: str, state: str, started_at: float, now: float) -> None:
        self.num_ended[state] += 1
        self.e2e.observe(now - started_at)
        for times in (self._launched_at, self._first_output_due, self._last_output_at):
            times.pop(instance_id, None)

    def inference_restarted(self) -> None:
        self.num_inference_restarts += 1

    def render(self) -> bytes:
        """The exposition text (Prometheus' text format 0.0.4); call on the loop's thread."""
        return generate_latest(self.registry)


class _SnapshotCollector:
    """The series read from the loop's snapshot at collection time."""

    def __init__(self, metrics: ControlMetrics):
        self._metrics = metrics

    def collect(self):
        m = self._metrics
        snap = m._snapshot()
        running = GaugeMetricFamily("oven:num_requests_running", "Instances running (launched, not ended).")
        running.add_metric([], len(snap.instances))
        yield running
        instances = GaugeMetricFamily("oven:instances", "Running instances by state.", labels=["state"])
        for state, count in sorted(Counter(i.shown_state for i in snap.instances).items()):
            instances.add_metric([state], count)
        yield instances
        ended = CounterMetricFamily("oven:requests", "Instances ended, by how they ended.", labels=["state"])
        for state, count in sorted(m.num_ended.items()):
            ended.add_metric([state], count)
        yield ended
        swapped = m._num_host_pages - snap.num_free_host_slots
        pages = GaugeMetricFamily("oven:kv_pages", "KvPages: used and free on the devices, swapped out to the "
                                  "host tier.", labels=["state"])
        for state, count in (("used", m._num_kv_pages - snap.num_free_kv_pages), ("free", snap.num_free_kv_pages),
                             ("swapped", swapped)):
            pages.add_metric([state], count)
        yield pages
        yield _counter("oven:generation_tokens", "Outputs (sampled tokens or distributions) given to instances.",
                       m.num_output_tokens)
        yield _counter("oven:batches", "Batches sent to inference processes.", snap.stats.num_batches)
        yield _batch_sizes(snap)
        yield _counter("oven:batch_items", "Items (calls) of those batches.", snap.stats.num_commands)
        yield _counter("oven:device_time_seconds", "Seconds inference processes spent on batches.", snap.device_s)
        yield _counter("oven:split_forwards", "Forwards longer than --prefill-chunk-tokens, sent in chunks.",
                       snap.num_split_forwards)
        yield _counter("oven:prefill_chunks", "The chunks those forwards were sent as.", snap.num_prefill_chunks)
        interceptions = CounterMetricFamily("oven:interceptions", "The interception policy's moves of an "
                                            "instance waiting on I/O.", labels=["decision"])
        for decision, count in (("swap_out", snap.num_swapped_out), ("swap_in", snap.num_swapped_in),
                                ("discard", snap.num_discarded)):
            interceptions.add_metric([decision], count)
        yield interceptions
        yield _counter("oven:preemptions", "Instances swapped out to answer an exhausted KvPage pool.",
                       snap.num_preempted)
        adapters = CounterMetricFamily("oven:adapter_requests", "LoRA adapters opened by instances.",
                                       labels=["adapter"])
        for name, count in sorted(m._adapter_uses.items()):
            adapters.add_metric([name], count)
        yield adapters
        yield _counter("oven:inference_restarts", "Inference processes started again after one died or hung.",
                       m.num_inference_restarts)


def _batch_sizes(snap: LoopSnapshot) -> HistogramMetricFamily:
    """The scheduler's own count of batches by size, in BATCH_SIZE_BUCKETS."""
    sizes, buckets, seen = snap.stats.batch_size_histogram, [], 0  # (num_items, num_batches), ascending
    k = 0
    for bound in BATCH_SIZE_BUCKETS:
        while k < len(sizes) and sizes[k][0] <= bound:
            seen += sizes[k][1]
            k += 1
        buckets.append((floatToGoString(bound), seen))
    buckets.append(("+Inf", snap.stats.num_batches))
    return HistogramMetricFamily("oven:batch_size", "Items (calls) of each batch sent to an inference process.",
                                 buckets=buckets, sum_value=snap.stats.num_commands)


def _counter(name: str, documentation: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, documentation, value=value)
