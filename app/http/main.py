"""The FastAPI application: ``create_app(settings)``.

On start-up (lifespan) the schema is checked — an empty database is migrated, an outdated
one refused — the built-in datasets are registered, and jobs get a worker: the in-process
thread pool, or, with ``CKA_BROKER_URL``, Celery (the API then only enqueues): both through
:func:`app.jobs.runtime.running`, the composition root.

Registering a built-in dataset loads it (scikit-learn's digits: seconds of imports) to check
its content. Where every built-in dataset has its row already (a second start), that check
runs in a thread beside the server, which answers at once: no request waits for it or reads
what it does, an error in it is logged, and the server's shutdown waits for it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from app.http.access import ResponseMiddleware
from app.http.api import (
    architectures,
    comparisons,
    datasets,
    jobs,
    models,
    results,
    studies,
    tokens,
    trainings,
)
from app.http.docs import install_docs
from app.http.ops import install_ops
from app.http.problems import install_problem_handlers
from app.http.ratelimit import make_limiter
from app.http.security import BodyLimitMiddleware, OriginMiddleware
from app.http.web import install_web
from app.jobs.compare import code_version
from app.jobs.runtime import running
from app.store.datasets import builtin_datasets_known, register_builtin_datasets
from app.store.db import ensure_schema
from app.store.services import Services
from app.store.settings import Settings

__all__ = ["create_app"]

log = logging.getLogger(__name__)

DESCRIPTION = """
Layer-by-layer CKA between neural networks. Upload checkpoints and datasets, queue a
comparison, poll it, and read its matrices and heatmaps. Errors are
`application/problem+json` with a stable `code` and the offending `field`; every list is
paginated with `limit` and `offset`. Once any token exists (`CKA_API_TOKENS` or
`cka-atlas token create`), writes need `Authorization: Bearer <token>` of scope `write`,
deletes and `/v1/tokens` one of scope `admin`; `CKA_WRITE_RATE` limits writes per token.
"""


def create_app(settings: Settings | None = None, *, start_worker: bool = True) -> FastAPI:
    """Build the app; nothing touches the database until the lifespan starts.

    ``start_worker=False``: no in-process worker, queued jobs wait (tests run them by hand).
    """
    settings = settings or Settings()
    beside: list[threading.Thread] = []

    def prepare(services: Services) -> None:
        if ensure_schema(services.db.engine) == "created":
            log.info("created the database schema at %s", services.db.engine.url)
        if builtin_datasets_known(services):
            check = threading.Thread(
                target=_register_builtins, args=(services,), name="builtin-datasets", daemon=True
            )
            check.start()
            beside.append(check)
        else:
            register_builtin_datasets(services)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        with running(settings, threads=None if start_worker else 0, prepare=prepare) as services:
            app.state.services = services
            try:
                yield
            finally:
                while beside:
                    beside.pop().join()

    app = FastAPI(
        title="cka-atlas",
        docs_url=None,  # /docs and /redoc come from app.http.docs, offline
        redoc_url=None,
        version=_version(),
        description=DESCRIPTION,
        lifespan=lifespan,
    )
    install_problem_handlers(app)
    app.state.write_limiter = make_limiter(settings)
    app.add_middleware(BodyLimitMiddleware, limit=settings.max_upload_bytes)
    app.add_middleware(OriginMiddleware, settings=settings)  # before any body is read
    app.add_middleware(ResponseMiddleware)  # nosniff and the access log's token name, on all

    for module in (
        architectures,
        models,
        datasets,
        trainings,
        comparisons,
        results,
        studies,
        jobs,
        tokens,
    ):
        app.include_router(module.router)

    install_ops(app)  # /healthz, /readyz, /metrics and the request timer (outermost)
    install_web(app)  # the pages at /, /static
    install_docs(app)  # /docs, /redoc and their assets at /docs/assets
    return app


def _register_builtins(services: Services) -> None:
    try:
        register_builtin_datasets(services)
    except Exception:  # the rows exist; a later start checks again
        log.exception("could not check the built-in datasets")


def _version() -> str:
    return code_version()
