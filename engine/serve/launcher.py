"""Start the speech server (`python -m engine.serve`) in a subprocess for tests and benchmarks.

Picks a free port, polls /health, fails fast with the log tail if the server dies
while starting, and on exit ends the whole process tree (server and every engine
stage, which live in their own process group).
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from engine.process.tree import kill_tree, tree_pids
from engine.runtime.registry import REGISTRY


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerDied(RuntimeError):
    pass


class RemoteServer:
    def __init__(self, args: list[str] = (), start_timeout: float = 300.0, env: dict | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile("w+", prefix="lanekeeper-serve-", suffix=".log", delete=False)
        # The server's own temporary folder (TMPDIR), removed with it: one killed outright cannot remove
        # what it made there (multiprocessing's fork-server socket folder, say).
        self.tmp = tempfile.mkdtemp(prefix="lanekeeper-serve-")
        cmd = [sys.executable, "-m", "engine.serve", "--host", "127.0.0.1", "--port", str(self.port), *args]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env={**os.environ, "TMPDIR": self.tmp, **(env or {}), "PYTHONUNBUFFERED": "1"})
        REGISTRY.register(self)
        try:
            self._wait_healthy(start_timeout)
        except BaseException:
            self.kill()
            raise

    def log_tail(self, lines: int = 40) -> str:
        self.log.flush()
        with open(self.log.name) as f:
            return "".join(f.readlines()[-lines:])

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerDied(f"server exited with {self.proc.returncode} while starting:\n{self.log_tail()}")
            if self.health() == 200:
                return
            time.sleep(0.2)
        raise TimeoutError(f"server not healthy within {timeout:.0f}s:\n{self.log_tail()}")

    def health(self) -> int | None:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code
        except (urllib.error.URLError, OSError):
            return None

    def pids(self) -> list[int]:
        return tree_pids([self.proc.pid]) if self.proc.poll() is None else []

    def terminate(self, timeout: float = 30.0) -> int | None:
        """SIGTERM and wait: the graceful path a deployment takes."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        REGISTRY.unregister(self)
        kill_tree([self.proc.pid])
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            pass
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> "RemoteServer":
        return self

    def __exit__(self, *exc) -> None:
        pids = self.pids()
        if self.proc.poll() is None:
            self.terminate(timeout=10)
        kill_tree(pids)   # stages that left the server's tree (their own group) are still ours
        self.kill()       # and its folder goes after every process that could write there
        self.log.close()
        os.unlink(self.log.name)
