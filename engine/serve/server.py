"""`lanekeeper serve` as a process: its socket, uvicorn around the app, and its exit status.

The app (engine/serve/app.py) answers requests; this decides how the process starts and ends, so that
an orchestrator can tell from the status alone what to do: a usage error (2) needs a person, an
engine that never started (3) or kept failing (4) needs the machine looked at, an address in use (5)
may be a previous server still shutting down.
"""
from __future__ import annotations

import errno
import logging
import os
import signal
import socket
import sys
from contextlib import contextmanager

from engine.errors import UserError
from engine.profile.location import profile_source
from engine.request import RequestError
from engine.runtime.devices import usable_platform
from engine.runtime.engine import TTSEngine
from engine.runtime.supervisor import RestartPolicy
from engine.serve.app import create_app

log = logging.getLogger("lanekeeper.server")

# The server's exit statuses besides 0 (stopped by SIGTERM/SIGINT) and 2 (a usage error); README lists them.
EXIT_STARTUP_FAILED = 3             # as uvicorn: the engine never started
EXIT_GAVE_UP = 4                    # the engine kept failing past the restart limit
EXIT_ADDRESS_IN_USE = 5             # another process listens on --host/--port
# An idle keep-alive connection stays open this long.  httpx (and so the openai client) reuses one for up to
# 5 s, uvicorn's own default: at equal times a client could send its next request just as the server closed
# the connection, and that request failed with a reset (httpx.ReadError) under load.
KEEP_ALIVE_S = 30


class AddressInUse(UserError):
    exit_code = EXIT_ADDRESS_IN_USE



def listen(host: str, port: int) -> socket.socket:
    """The server's socket, bound before the engine starts, so that a taken address fails at once and
    distinctly (EXIT_ADDRESS_IN_USE), not after a start-up as an engine failure."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as e:
        raise UserError(f"--host {host}: not an address here ({e.strerror})") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as uvicorn: a restart need not wait out TIME_WAIT
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise AddressInUse(f"--host {host} --port {port}: the address is in use by another process; "
                               "stop it or choose another --port") from None
        raise UserError(f"--host {host} --port {port}: cannot listen there ({e.strerror})") from None
    return sock


@contextmanager
def _stop_signals_end(server):
    """SIGTERM and SIGINT ask uvicorn to shut down, and then the process returns 0.  Once its graceful
    shutdown is done, uvicorn raises the signal it caught again under the handler it found; under the
    default one the process would die of it (status -15) before its exit handlers run, leaving the fork
    server's socket folder behind and the documented status unmet.  This handler asks for the same
    shutdown (also in the moment before uvicorn takes the signals over) and lets the process go on."""
    def stop(signum, frame):
        server.should_exit = True

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def serve(profile, host: str = "127.0.0.1", port: int = 8000, allowed_local_media_path: str | None = None,
          graceful_timeout: float = 30.0, policy: RestartPolicy = RestartPolicy(), cpu_fallback: bool = False) -> int:
    """Serve until SIGTERM/SIGINT (0), until the engine failed past the restart limit (EXIT_GAVE_UP), or
    exit at once when the engine never started (EXIT_STARTUP_FAILED)."""
    import uvicorn

    if allowed_local_media_path and not os.path.isdir(allowed_local_media_path):
        raise RequestError(f"--allowed-local-media-path {allowed_local_media_path}: not a directory",
                           "allowed_local_media_path")
    if not cpu_fallback:   # a missing device is the user's to fix: one line and status 2, before anything starts
        usable_platform(profile.platform, cpu_fallback)
    sock = listen(host, port)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log.info("listening on http://%s:%d; starting the engine for profile %s from %s (%s)", host, port,
             profile.name, profile.path, profile_source().origin)
    outcome = {"code": 0}
    server: uvicorn.Server | None = None

    def give_up(reason: str) -> None:
        outcome["code"] = EXIT_GAVE_UP
        server.should_exit = True   # uvicorn's own shutdown: in-flight requests end, the lifespan closes

    def start_failed(error: Exception) -> None:
        log.debug("engine start-up failed", exc_info=error)
        print(f"lanekeeper: error: the engine failed to start: {error}", file=sys.stderr, flush=True)
        outcome["code"] = EXIT_STARTUP_FAILED
        server.should_exit = True

    app = create_app(lambda: TTSEngine(profile, cpu_fallback=cpu_fallback), allowed_local_media_path, policy=policy,
                     on_give_up=give_up, on_start_failed=start_failed)
    server = uvicorn.Server(uvicorn.Config(app, log_level="info", timeout_graceful_shutdown=graceful_timeout,
                                           timeout_keep_alive=KEEP_ALIVE_S))
    with sock, _stop_signals_end(server):
        server.run(sockets=[sock])
    if not server.started and not outcome["code"]:
        return EXIT_STARTUP_FAILED
    return outcome["code"]
