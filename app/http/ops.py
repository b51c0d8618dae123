"""Operations endpoints: liveness, readiness and Prometheus metrics.

``/healthz``
    the process answers (no dependency is touched), for a liveness probe.
``/readyz``
    the database answers and its schema is current, the broker answers when one is
    configured, and the jobs' device can allocate memory; 503 with the failing checks
    otherwise, for a readiness probe or a load balancer.
``/metrics``
    Prometheus text format. Request latency is a histogram labelled by the route
    *template* (``/v1/comparisons/{comparison_id}``, never the raw path, so cardinality stays
    bounded), method and status. Jobs by status and job durations are read from the jobs
    table at scrape time, so they count work done by every worker process (embedded or
    Celery), not only this one. Device memory is this process's: the GPU allocator's
    figures on CUDA, resident memory on CPU.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.responses import JSONResponse
from kombu import Connection
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import func, select, text
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.http.security import READ
from app.store.db import current_revision, head_revision
from app.store.orm import JOB_STATES, Job, JobState, utcnow

__all__ = [
    "JOB_DURATION_BUCKETS",
    "MetricsMiddleware",
    "ServiceCollector",
    "check_broker",
    "check_database",
    "check_device",
    "install_ops",
    "router",
]

log = logging.getLogger(__name__)
router = APIRouter(tags=["operations"])
JOB_DURATION_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600)


@dataclass(frozen=True)
class Check:
    """The outcome of one readiness check."""

    ok: bool
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "detail": self.detail}


def check_database(services: Any) -> Check:
    """The database answers a query and is at the schema revision this code needs."""
    try:
        with services.db.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        current, head = current_revision(services.db.engine), head_revision()
    except Exception as exc:
        return Check(False, f"{type(exc).__name__}: {exc}"[:300])
    if current != head:
        return Check(False, f"schema at {current}, code needs {head}; run `cka-atlas db upgrade`")
    return Check(True, f"{services.db.engine.dialect.name}, schema {head}")


def check_broker(url: str | None, timeout: float = 2.0) -> Check:
    """The Celery broker accepts a connection (trivially ready when none is configured)."""
    if not url:
        return Check(True, "not configured (in-process worker)")

    try:
        with Connection(url, connect_timeout=timeout) as conn:
            conn.ensure_connection(max_retries=1, timeout=timeout)
    except Exception as exc:
        return Check(False, f"{type(exc).__name__}: {exc}"[:300])
    return Check(True, f"{url.split('://', 1)[0]} broker reachable")


def check_device(device: str) -> Check:
    """The jobs' torch device exists and can allocate a tensor."""
    try:
        torch.empty(1, device=device)
    except Exception as exc:
        return Check(False, f"device {device} unavailable: {exc}"[:300])
    return Check(True, device)


@router.get("/healthz", summary="Liveness: the process answers")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get(
    "/readyz",
    summary="Readiness: database, broker and device",
    responses={503: {"description": "A dependency is not ready; `checks` says which"}},
)
def readyz(request: Request) -> JSONResponse:
    services = request.app.state.services
    checks = {
        "database": check_database(services),
        "broker": check_broker(services.settings.broker_url),
        "device": check_device(services.device),
    }
    ready = all(c.ok for c in checks.values())
    if not ready:
        failing = {k: c.detail for k, c in checks.items() if not c.ok}
        log.warning("not ready: %s", failing)
    body = {
        "status": "ready" if ready else "not_ready",
        "checks": {k: c.as_dict() for k, c in checks.items()},
    }
    return JSONResponse(body, status_code=200 if ready else 503)


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}},
    **READ,
)
def metrics(request: Request) -> Response:
    registry: CollectorRegistry = request.app.state.metrics_registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


class ServiceCollector(Collector):
    """Gauges and histograms computed at scrape time from the database and the device."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app

    def collect(self) -> Iterator[Any]:
        services = getattr(self.app.state, "services", None)
        if services is None:  # scraped before start-up finished
            return
        try:
            yield from self._jobs(services)
        except Exception:  # a scrape must not fail because the database blinked
            log.warning("could not read job metrics", exc_info=True)
        yield self._device_memory(services.device)

    def _jobs(self, services: Any) -> Iterator[Any]:
        with services.db.session(readonly=True) as s:
            counts = s.execute(
                select(Job.kind, Job.status, func.count()).group_by(Job.kind, Job.status)
            )
            by_status = {(k, st): int(n) for k, st, n in counts}
            oldest = s.scalar(select(func.min(Job.created_at)).where(Job.status == JobState.QUEUED))
            spans = s.execute(
                select(Job.kind, Job.status, Job.started_at, Job.finished_at).where(
                    Job.started_at.is_not(None), Job.finished_at.is_not(None)
                )
            ).all()

        jobs = GaugeMetricFamily(
            "cka_jobs", "Jobs in the jobs table by kind and status.", labels=["kind", "status"]
        )
        for kind in sorted({k for k, _ in by_status} | {"comparison", "training", "study"}):
            for status in JOB_STATES:
                jobs.add_metric([kind, status], by_status.get((kind, status), 0))
        yield jobs

        age = GaugeMetricFamily(
            "cka_job_oldest_queued_age_seconds",
            "Age of the oldest queued job (0 when the queue is empty).",
        )
        if oldest is not None:
            age.add_metric([], max((utcnow() - oldest).total_seconds(), 0.0))
        else:
            age.add_metric([], 0.0)
        yield age

        yield _duration_histogram(spans)

    @staticmethod
    def _device_memory(device: str) -> GaugeMetricFamily:
        gauge = GaugeMetricFamily(
            "cka_device_memory_bytes",
            "Memory of the jobs' device used by this process: allocated/reserved/total on "
            "CUDA, resident on CPU.",
            labels=["device", "kind"],
        )

        if device.startswith("cuda") and torch.cuda.is_available():
            for i in range(torch.cuda.device_count()):
                name = f"cuda:{i}"
                gauge.add_metric([name, "allocated"], float(torch.cuda.memory_allocated(i)))
                gauge.add_metric([name, "reserved"], float(torch.cuda.memory_reserved(i)))
                total = torch.cuda.get_device_properties(i).total_memory
                gauge.add_metric([name, "total"], float(total))
        else:
            rss = _resident_bytes()
            if rss is not None:
                gauge.add_metric([device, "resident"], float(rss))
        return gauge


def _duration_histogram(spans: Any) -> HistogramMetricFamily:
    """Cumulative buckets of ``finished_at - started_at`` per (kind, status)."""
    per: dict[tuple[str, str], list[float]] = {}
    for kind, status, started, finished in spans:
        per.setdefault((kind, status), []).append(max((finished - started).total_seconds(), 0.0))
    hist = HistogramMetricFamily(
        "cka_job_duration_seconds",
        "Wall time of finished jobs from claim to finish, by kind and final status.",
        labels=["kind", "status"],
    )
    for (kind, status), values in sorted(per.items()):
        buckets = [
            (str(float(b)), float(sum(v <= b for v in values))) for b in JOB_DURATION_BUCKETS
        ]
        buckets.append(("+Inf", float(len(values))))
        hist.add_metric([kind, status], buckets, sum(values))
    return hist


def _resident_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE")


class MetricsMiddleware:
    """Time every HTTP request into ``histogram`` by route template, method and status."""

    def __init__(self, app: ASGIApp, histogram: Histogram) -> None:
        self.app = app
        self.histogram = histogram

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "<unmatched>"
            self.histogram.labels(template, scope["method"], str(status)).observe(
                time.perf_counter() - start
            )


def install_ops(app: FastAPI) -> None:
    """Add the operations routes, the request timer and the scrape-time collector to ``app``."""
    registry = CollectorRegistry()
    latency = Histogram(
        "cka_http_request_duration_seconds",
        "HTTP request latency by route template, method and status.",
        ["route", "method", "status"],
        registry=registry,
    )
    registry.register(ServiceCollector(app))
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    app.state.metrics_registry = registry
    app.include_router(router)
    app.add_middleware(MetricsMiddleware, histogram=latency)
