"""A CI API (Buildkite- or GitHub-shaped) served from 127.0.0.1 for the tests of its clients."""
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

TOKEN = "s3cr3t-token-value"


class Routes(dict):
    """path -> body (bytes, JSON-able, or a callable taking (query, payload)); POSTs are kept in `posts`."""

    def __init__(self):
        super().__init__()
        self.posts: list[tuple[str, dict]] = []


@pytest.fixture
def api():
    routes = Routes()

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, payload=None):
            if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                self.send_response(401)
                self.end_headers()
                return
            path, _, query = self.path.partition("?")
            body = routes.get(f"{self.command} {path}", routes.get(path))
            if callable(body):
                body = body(query, payload)
            if body is None:
                self.send_response(404)
                self.end_headers()
                return
            self.send_response(201 if self.command == "POST" else 200)
            self.end_headers()
            self.wfile.write(body if isinstance(body, bytes) else json.dumps(body).encode())

        def do_GET(self):
            self._answer()

        def do_POST(self):
            payload = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"null")
            routes.posts.append((self.path, payload))
            self._answer(payload)

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_port}"
    yield base, routes
    server.shutdown()
    server.server_close()
