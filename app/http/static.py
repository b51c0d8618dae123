"""Static files with cache headers: a URL that names its content is kept, any other revalidated.

The pages link their scripts and styles as ``/static/<name>?v=<content hash>``
(:func:`app.http.web.templating.static_url`): such a URL always answers the same bytes, so a
browser keeps it a year without asking again. A URL without the current hash (an old page, a
hand-typed address, the API docs' assets) is answered with ``no-cache`` or ``fallback``: a
browser asks again each time and gets a 304 from the ETag while the file is unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from urllib.parse import parse_qs

from fastapi.staticfiles import StaticFiles
from starlette.responses import Response
from starlette.types import Scope

__all__ = ["IMMUTABLE", "CachedStaticFiles"]

IMMUTABLE = "public, max-age=31536000, immutable"


class CachedStaticFiles(StaticFiles):
    """:class:`StaticFiles` with ``Cache-Control``: :data:`IMMUTABLE` when the ``v`` query
    parameter is ``version(path)``, else ``fallback``."""

    def __init__(
        self,
        *,
        directory: str | Path,
        version: Callable[[str], str] | None = None,
        fallback: str = "no-cache",
    ) -> None:
        super().__init__(directory=directory)
        self.version = version
        self.fallback = fallback

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        if response.status_code in (200, 304):
            asked = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("v")
            named = self.version is not None and asked is not None
            fresh = named and asked == [self.version(path)]  # type: ignore[misc]
            response.headers["Cache-Control"] = IMMUTABLE if fresh else self.fallback
        return response
