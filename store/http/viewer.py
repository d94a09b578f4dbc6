"""The browser viewer at ``/ui/``: static files shipped in the package (``store/http/ui/``).

The viewer is plain HTML, CSS and JavaScript modules (no build step, nothing fetched from
elsewhere). The files themselves are public (route class ``ui``, ``store/http/access.py``):
they hold no data. Everything the viewer shows it reads from this service's own data routes
(``/v1/sessions``, ``/v1/stream/...``), with the token the user gives it, under the same checks
as any other client; the guard's ``Host`` check applies to these files as to every route.

Every answer carries a Content-Security-Policy that lets the page load only this origin's
scripts and styles and talk only to this origin (images: this origin and ``data:`` URLs, which
is how a message's images are shown), so content of a session can never run as script, load
from elsewhere, or send anything elsewhere.
"""

from __future__ import annotations

from importlib import resources

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from store.http.wire import problem_response

UI_ROOT = "/ui/"

_CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
#: Only this origin's scripts, styles and requests; images also as data: URLs (a message's
#: images); no frames, no forms, no plugins.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


def _load() -> dict[str, tuple[bytes, str]]:
    """The viewer's files by name, read once from the package."""
    files: dict[str, tuple[bytes, str]] = {}
    for item in (resources.files("store.http") / "ui").iterdir():
        suffix = "." + item.name.rpartition(".")[2]
        if item.is_file() and suffix in _CONTENT_TYPES:
            files[item.name] = (item.read_bytes(), _CONTENT_TYPES[suffix])
    return files


class ViewerFiles:
    """``GET /ui/<file>`` (``/ui/``: ``index.html``; ``/ui``: a redirect to ``/ui/``)."""

    def __init__(self) -> None:
        self.files = _load()

    async def redirect(self, request: Request) -> Response:
        return RedirectResponse(UI_ROOT, status_code=308)

    async def handle(self, request: Request) -> Response:
        name = request.path_params.get("path") or "index.html"
        found = self.files.get(name)
        if found is None:
            return problem_response(404, "not-found", "no file of the viewer by that name")
        body, content_type = found
        return Response(body, headers={
            "content-type": content_type,
            "Cache-Control": "no-cache",
            "Content-Security-Policy": CONTENT_SECURITY_POLICY,
            "Referrer-Policy": "no-referrer",
            "X-Frame-Options": "DENY",
        })


__all__ = ["CONTENT_SECURITY_POLICY", "UI_ROOT", "ViewerFiles"]
