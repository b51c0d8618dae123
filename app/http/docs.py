"""``/docs`` and ``/redoc``: the API's documentation, served with no other host involved.

FastAPI's own documentation pages load Swagger UI and ReDoc from a CDN, so they are blank
offline. Here the assets come from the installed ``fastapi-offline`` package (which ships
them), and the pages carry a Content-Security-Policy that lets them load nothing from any
other host: ReDoc's bundle would otherwise fetch its logo from its CDN.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.resources import files
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

__all__ = ["ASSETS", "install_docs"]

ASSETS = "/docs/assets"

# Swagger UI starts itself with an inline script, and both tools inject inline styles;
# ReDoc runs its search in a worker made from a blob. Nothing else, and nothing remote.
DOCS_CSP = (
    "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
    "script-src 'self' 'unsafe-inline'; worker-src 'self' blob:; connect-src 'self'; "
    "object-src 'none'; frame-ancestors 'none'; base-uri 'none'"
)


def install_docs(app: FastAPI) -> None:
    """Add ``/docs``, ``/redoc`` and their assets to ``app`` (built with ``docs_url=None``)."""
    static = files("fastapi_offline") / "static"
    app.mount(ASSETS, StaticFiles(directory=str(static)), name="docs-assets")
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
