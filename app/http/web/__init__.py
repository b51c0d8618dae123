"""The web page: server-rendered Jinja2 pages over the same database as the REST API.

Pages read through the repository layer and link to the REST endpoints for downloads; the
only writes (starting and cancelling comparisons) are made by the page's scripts against
``/v1`` itself, so the page has no privileged back door. Heatmaps are drawn in the browser
by the vendored ``static/heatmap.js`` from the stored matrices; nothing comes from a CDN.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import Response

from app.http.static import CachedStaticFiles
from app.http.web import auth, catalog, comparisons, jobs, studies
from app.http.web.auth import LoginRequired, login_page
from app.http.web.rendering import PageNotFound, not_found_page
from app.http.web.templating import STATIC_DIR, static_digest

__all__ = ["install_web"]


def install_web(app: FastAPI) -> None:
    """Add the page routes, the static files and the login redirect to ``app``."""

    @app.exception_handler(LoginRequired)
    async def _login(request: Request, exc: LoginRequired) -> Response:
        return login_page(request, next_path=exc.next_path, status=401)

    @app.exception_handler(PageNotFound)
    async def _missing(request: Request, exc: PageNotFound) -> Response:
        return not_found_page(request, exc.auth, exc.what)

    for module in (comparisons, catalog, studies, jobs, auth):
        app.include_router(module.router)
    static = CachedStaticFiles(directory=STATIC_DIR, version=static_digest)
    app.mount("/static", static, name="static")
