"""``oven serve --metrics-port PORT``: the control process's metrics over HTTP, for Prometheus.

prometheus_client's own server answers on a thread of its own, bound to 127.0.0.1 (no token is
asked, so no other machine is served; a remote scraper reads ``/metrics`` on the OpenAI port with
a key instead). The registry belongs to the control loop, which is one thread: a scrape posts the
collection to the loop and waits for it, so no series is read while the loop changes it.
"""

from __future__ import annotations

import errno
import threading

from prometheus_client import start_http_server

HOST = "127.0.0.1"
COLLECT_TIMEOUT_S = 10.0  # a loop this late to answer gets an empty scrape rather than a hung one


class MetricsPortError(RuntimeError):
    pass


class LoopRegistry:
    """What prometheus_client's server collects: the loop's registry, gathered on the loop's thread
    (nothing until :attr:`loop` is set, once the model serves)."""

    def __init__(self):
        self.loop = None

    def collect(self):
        loop = self.loop
        if loop is None:
            return
        done, gathered = threading.Event(), []

        def gather() -> None:
            try:
                gathered.append(list(loop.metrics.registry.collect()))
            finally:
                done.set()

        loop.post(gather)
        if done.wait(COLLECT_TIMEOUT_S) and gathered:
            yield from gathered[0]


class MetricsServer:
    """Listening from construction (so a port in use fails before the model loads) until :meth:`close`."""

    def __init__(self, port: int):
        self.registry = LoopRegistry()
        try:
            self._httpd, self._thread = start_http_server(port, HOST, registry=self.registry)
        except OSError as exc:
            reason = "the address is in use" if exc.errno == errno.EADDRINUSE else exc.strerror or str(exc)
            raise MetricsPortError(f"cannot serve metrics on http://{HOST}:{port}/metrics: {reason}") from None
        self.url = f"http://{HOST}:{self._httpd.server_port}/metrics"

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
