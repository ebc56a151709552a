"""The front end's own Prometheus series: its HTTP requests by route and status, and their latency.

``/metrics`` answers these followed by the control process's (``OvenClient.metrics``). Routes are
the app's route templates (anything else is ``other``), so a scan of random paths adds no series.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class FrontEndMetrics:
    def __init__(self, routes: list[str]):
        self.routes = routes
        self.registry = CollectorRegistry()
        self.requests = Counter("oven:http_requests", "HTTP requests answered by the OpenAI front end.",
                                ["route", "method", "status"], registry=self.registry)
        self.latency = Histogram("oven:http_request_duration_seconds", "From a request's arrival to the end of "
                                 "its response (a stream's last event).", ["route", "method"],
                                 buckets=LATENCY_BUCKETS, registry=self.registry)

    def route_of(self, path: str) -> str:
        """The template of the route ``path`` matches (``/v1/models/{model}``), or ``other``."""
        if path in self.routes:
            return path
        for route in self.routes:
            head, brace, _ = route.partition("{")
            if brace and path.startswith(head) and len(path) > len(head):
                return route
        return "other"

    def render(self) -> bytes:
        return generate_latest(self.registry)


class MetricsMiddleware:
    """ASGI middleware counting every HTTP request of the app it wraps."""

    def __init__(self, app, metrics: FrontEndMetrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start, status = time.monotonic(), [500]

        async def sending(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            route, method = self.metrics.route_of(scope["path"]), scope["method"]
            self.metrics.requests.labels(route, method, str(status[0])).inc()
            self.metrics.latency.labels(route, method).observe(time.monotonic() - start)
