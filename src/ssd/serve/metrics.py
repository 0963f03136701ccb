"""The server's Prometheus metrics (``GET /metrics``, text exposition format, through ``prometheus_client``): requests
and errors by route and status, request latency and batch sizes as histograms.

Each app has its own registry, so that two servers in one process (tests) count apart.
"""

from __future__ import annotations

import time

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest

__all__ = ["ServerMetrics", "MetricsMiddleware", "LATENCY_BUCKETS", "BATCH_BUCKETS"]

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""Upper bounds of the latency histogram, in seconds."""

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
"""Upper bounds of the batch-size histogram, in images."""

UNMATCHED = "unmatched"
"""The route label of requests no route matched (404), so that made-up paths add no label values."""


class ServerMetrics:
    """The counters and histograms of one server, in their own registry."""

    def __init__(self):
        self.registry = CollectorRegistry()
        labels = ["route", "status"]
        self.requests = Counter("ssd_requests", "HTTP requests answered, by route and status", labels,
                                registry=self.registry)
        self.errors = Counter("ssd_request_errors", "HTTP requests answered with an error status (4xx, 5xx)", labels,
                              registry=self.registry)
        self.latency = Histogram("ssd_request_latency_seconds", "Time from a request's arrival to its answer",
                                 ["route"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.batch_size = Histogram("ssd_batch_size", "Images per batch run through the network",
                                    buckets=BATCH_BUCKETS, registry=self.registry)

    def observe(self, route: str, status: int, seconds: float) -> None:
        self.requests.labels(route, str(status)).inc()
        if status >= 400:
            self.errors.labels(route, str(status)).inc()
        self.latency.labels(route).observe(seconds)

    def exposition(self) -> tuple[bytes, str]:
        """The metrics as Prometheus text, and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class MetricsMiddleware:
    """ASGI middleware counting every HTTP request by its route's path template (``/predict``), its status (500 when
    the app raised) and its latency."""

    def __init__(self, app, metrics: ServerMetrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, status = time.perf_counter(), 500

        async def send_status(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = getattr(scope.get("route"), "path", UNMATCHED)
            self.metrics.observe(route, status, time.perf_counter() - start)
