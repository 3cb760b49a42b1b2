"""The web console: one page and its script and style, served by the admin HTTP server at ``/``.

The page holds no data: everything it shows it fetches from the admin API (the same calls the CLI
makes), with the user's token when authentication is on, so nothing is computed twice and the
API's checks apply to every figure. The files are package data written for siftmq (no CDN, no
framework): the console works offline. A strict Content-Security-Policy allows only these files,
and the script puts what it fetches into the page as text, never as markup.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Final

from fastapi import APIRouter
from fastapi.responses import Response

_FILES: Final = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/console/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/console/app.css": ("app.css", "text/css; charset=utf-8"),
    "/console/icon.svg": ("icon.svg", "image/svg+xml"),
}
CONSOLE_PATHS: Final = frozenset(_FILES)
_HEADERS: Final = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def console_router() -> APIRouter:
    """The console's routes: its page at ``/`` and its files under ``/console/``."""
    router = APIRouter(include_in_schema=False)
    static = resources.files(__package__).joinpath("static")
    for path, (name, media_type) in _FILES.items():
        router.add_api_route(path, _serving(static.joinpath(name).read_bytes(), media_type), methods=["GET"])
    return router


def _serving(content: bytes, media_type: str) -> Callable[[], Awaitable[Response]]:
    # a closure, not default arguments: FastAPI would take those for query parameters
    async def serve() -> Response:
        return Response(content, media_type=media_type, headers=_HEADERS)

    return serve
