"""CI APIs (Buildkite- or GitHub-shaped) and an object store, served from 127.0.0.1 for the tests of
their clients: `serve(Routes())` answers each path as the routes say."""
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


TOKEN = "s3cr3t-token-value"


@dataclass
class Reply:
    """A whole answer: a status, headers, and a body that may trickle in a byte at a time."""
    status: int = 200
    headers: dict = field(default_factory=dict)
    body: bytes = b""
    trickle: float = 0.0     # seconds between bytes


class Routes(dict):
    """path (or "METHOD path") -> body (bytes, JSON-able, a Reply, or a callable taking (query, payload)).
    Every request is kept in `seen` as (method, path, headers); POST payloads also in `posts`."""

    def __init__(self, auth: bool = True, refuse_auth: bool = False):
        super().__init__()
        self.auth, self.refuse_auth = auth, refuse_auth
        self.posts: list[tuple[str, dict]] = []
        self.seen: list[tuple[str, str, dict]] = []


def serve(routes: Routes):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _answer(self, payload=None):
            routes.seen.append((self.command, self.path, dict(self.headers)))
            path, _, query = self.path.partition("?")
            body = routes.get(f"{self.command} {path}", routes.get(path))
            if routes.auth and self.headers.get("Authorization") != f"Bearer {TOKEN}":
                body = Reply(401)
            if routes.refuse_auth and "Authorization" in self.headers:
                body = Reply(400, body=b"Only one auth mechanism allowed")
            if callable(body):
                body = body(query, payload)
            if body is None:
                body = Reply(404)
            if not isinstance(body, Reply):
                body = Reply(201 if self.command == "POST" else 200,
                             body=body if isinstance(body, bytes) else json.dumps(body).encode())
            self.send_response(body.status)
            for name, value in body.headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body.body)))
            self.end_headers()
            try:
                if body.trickle:
                    for i in range(len(body.body)):
                        self.wfile.write(body.body[i:i + 1])
                        self.wfile.flush()
                        time.sleep(body.trickle)
                else:
                    self.wfile.write(body.body)
            except (BrokenPipeError, ConnectionResetError):
                pass

        def do_GET(self):
            self._answer()

        def do_POST(self):
            payload = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"null")
            routes.posts.append((self.path, payload))
            self._answer(payload)

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_port}"
