"""`lemur-data inspect --serve [PORT]`: the page over HTTP on 127.0.0.1 only, and nothing
else: every other path is a 404, every method but GET and HEAD a 405. The page needs no
server (it opens from file://); this is for a build on a remote machine reached through an
SSH tunnel (`ssh -L 8000:127.0.0.1:8000 host`)."""

from __future__ import annotations

import http.server
from collections.abc import Callable
from typing import Any

from lemur.cli_common import Terminated

HOST = "127.0.0.1"
PAGE_PATHS = ("/", "/index.html", "/inspect.html")


def handler_for(page: bytes) -> type[http.server.BaseHTTPRequestHandler]:
    """A request handler that answers the page at PAGE_PATHS and nothing else."""

    class PageHandler(http.server.BaseHTTPRequestHandler):
        """GET/HEAD of the page; anything else refused."""

        server_version = "lemur-inspect"
        sys_version = ""

        def _answer(self, body: bool) -> None:
            if self.path.split("?", 1)[0] not in PAGE_PATHS:
                self.send_error(404, "only the page is served here")
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(page)))
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            if body:
                self.wfile.write(page)

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            """The page."""
            self._answer(True)

        def do_HEAD(self) -> None:  # noqa: N802
            """The page's headers."""
            self._answer(False)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            """Quiet: the terminal keeps the one line saying where the page is."""

    for method in ("POST", "PUT", "DELETE", "PATCH", "OPTIONS"):
        setattr(PageHandler, f"do_{method}", lambda self: self.send_error(405))
    return PageHandler


def serve(page: str, port: int, say: Callable[[str], None] = print) -> int:
    """Serve `page` (its own meta tag carries the Content-Security-Policy) on
    127.0.0.1:`port` (0: any free port) until Ctrl-C or SIGTERM, which end it cleanly."""
    server = http.server.ThreadingHTTPServer((HOST, port), handler_for(page.encode("utf-8")))
    server.daemon_threads = True
    try:
        say(f"serving http://{HOST}:{server.server_address[1]}/ (Ctrl-C stops)")
        server.serve_forever()
    except (KeyboardInterrupt, Terminated):
        say("stopped")
    finally:
        server.server_close()
    return 0
