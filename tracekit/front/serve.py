"""Serving a trace file to the Perfetto UI, as Perfetto's `open_trace_in_ui` does: an HTTP
server on 127.0.0.1 that answers one path (the file's name) with the file and a CORS header
for the UI's origin, 404 for anything else, and stops once the file has been fetched."""

from __future__ import annotations

import errno
import http.server
import webbrowser
from pathlib import Path
from urllib.parse import quote

from tracekit.core.errors import TraceError

UI_ORIGIN = "https://ui.perfetto.dev"


def ui_link(port: int, name: str) -> str:
    return f"{UI_ORIGIN}/#!/?url=http://127.0.0.1:{port}/{quote(name)}"


def make_server(path: Path, port: int) -> http.server.HTTPServer:
    """A server for `path` on 127.0.0.1:port; `server.fetched` turns True once it was sent."""
    data, route = path.read_bytes(), "/" + quote(path.name)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path.split("?")[0] != route:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Access-Control-Allow-Origin", UI_ORIGIN)
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            self.server.fetched = True

        def log_message(self, *args):
            pass

    try:
        server = http.server.HTTPServer(("127.0.0.1", port), Handler)
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise TraceError(f"127.0.0.1:{port}", "port is taken; pass --port") from None
        raise
    server.fetched = False
    return server


def serve_once(path: Path, port: int, browser: bool, say) -> None:
    server = make_server(path, port)
    link = ui_link(server.server_address[1], path.name)
    say(f"tracekit: open {link}")
    if browser:
        webbrowser.open(link)
    with server:
        while not server.fetched:
            server.handle_request()
    say("tracekit: the trace was fetched; done")
