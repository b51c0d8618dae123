"""``/docs`` and ``/redoc``: the API's documentation, served with no other host involved.

FastAPI's own documentation pages load Swagger UI and ReDoc from a CDN, so they are blank
offline. Here the assets come from the installed ``fastapi-offline`` package (which ships
them), and the pages carry a Content-Security-Policy that lets them load nothing from any
other host: ReDoc's bundle would otherwise fetch its logo from its CDN.

The OpenAPI schema both pages read is built once per process, from a thread started with
the app, rather than by the first request for it: FastAPI builds it lazily, a quarter of a
second of CPU that a busy server (a training holding the interpreter) stretched to seconds
of the first ``/docs`` (BENCHMARKS.md, ``bench/bench_docs.py``). Every app of a process with
the same routes shares it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from importlib.resources import files
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse

from app.http.static import CachedStaticFiles

__all__ = ["ASSETS", "install_docs"]

ASSETS = "/docs/assets"

# Swagger UI starts itself with an inline script, and both tools inject inline styles;
# ReDoc runs its search in a worker made from a blob. Nothing else, and nothing remote.
DOCS_CSP = (
    "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
    "script-src 'self' 'unsafe-inline'; worker-src 'self' blob:; connect-src 'self'; "
    "object-src 'none'; frame-ancestors 'none'; base-uri 'none'"
)


_SCHEMAS: dict[tuple[Any, ...], dict[str, Any]] = {}
_BUILDING = threading.Lock()


def _identity(app: FastAPI) -> tuple[Any, ...]:
    """What an app's OpenAPI schema is made of: its title, version, description, routes."""
    routes = tuple(
        (
            getattr(r, "path", ""),
            tuple(sorted(getattr(r, "methods", None) or ())),
            getattr(r, "name", ""),
        )
        for r in app.routes
    )
    return (app.title, app.version, app.description, app.openapi_version, routes)


def _shared_schema(app: FastAPI) -> Callable[[], dict[str, Any]]:
    """``app.openapi``, with the schema built once for every app of the process like it."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            with _BUILDING:
                key = _identity(app)
                if key not in _SCHEMAS:
                    _SCHEMAS[key] = build()
                app.openapi_schema = _SCHEMAS[key]
        return app.openapi_schema

    return openapi


def install_docs(app: FastAPI) -> None:
    """Add ``/docs``, ``/redoc`` and their assets to ``app`` (built with ``docs_url=None``),
    last, once every route is there: a thread builds the schema (or finds it built)."""
    app.openapi = _shared_schema(app)  # type: ignore[method-assign]
    static = files("fastapi_offline") / "static"
    # the assets of the installed fastapi-offline: a day's cache, then revalidated
    assets = CachedStaticFiles(directory=str(static), fallback="public, max-age=86400")
    app.mount(ASSETS, assets, name="docs-assets")
    openapi = app.openapi_url or "/openapi.json"

    def offline(page: Callable[..., HTMLResponse], **assets: Any) -> Callable[[], HTMLResponse]:
        """An endpoint answering ``page`` (FastAPI's Swagger UI or ReDoc page) for this app's
        schema with ``assets``, under the CSP that keeps it from loading anything remote."""

        def endpoint() -> HTMLResponse:
            html = page(openapi_url=openapi, title=f"{app.title} · REST API", **assets)
            html.headers["Content-Security-Policy"] = DOCS_CSP
            return html

        return endpoint

    swagger = offline(
        get_swagger_ui_html,
        swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
        swagger_css_url=f"{ASSETS}/swagger-ui.css",
        swagger_favicon_url="/static/favicon.svg",
        # Swagger UI would otherwise send the schema to validator.swagger.io.
        swagger_ui_parameters={"validatorUrl": None},
    )
    app.add_api_route("/docs", swagger, include_in_schema=False, name="swagger_ui")
    redoc = offline(
        get_redoc_html,
        redoc_js_url=f"{ASSETS}/redoc.standalone.js",
        redoc_favicon_url="/static/favicon.svg",
        with_google_fonts=False,
    )
    app.add_api_route("/redoc", redoc, include_in_schema=False, name="redoc")
    threading.Thread(target=app.openapi, name="openapi-schema", daemon=True).start()
