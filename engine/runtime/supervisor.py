"""Keeps a serving engine alive: a dead or stalled stage gets a fresh engine, within limits.

The watchdog already fails the requests a dead or stalled stage holds, with their
diagnosis, and records the engine's `verdict`.  The supervisor acts on that verdict:
it kills the broken engine's processes and builds a new engine, after a backoff that
doubles with each restart inside the window.  Past `max_restarts` restarts within
`window_s` it gives up, because a fault that comes straight back is one an
orchestrator should see: the server then reports unhealthy and exits non-zero.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

log = logging.getLogger("lanekeeper.supervisor")


@dataclass(frozen=True)
class RestartPolicy:
    max_restarts: int = 5
    window_s: float = 300.0
    backoff_s: float = 1.0
    max_backoff_s: float = 30.0

    def backoff(self, recent: int) -> float:
        """Wait before the restart that follows `recent` earlier ones inside the window."""
        return min(self.max_backoff_s, self.backoff_s * 2 ** recent)


class Supervisor(threading.Thread):
    """`state`: starting, ok, restarting, or failed (given up).  `engine` is the one to submit to."""

    def __init__(self, factory: Callable[[], object], policy: RestartPolicy = RestartPolicy(),
                 on_give_up: Callable[[str], None] = lambda reason: None,
                 on_restart: Callable[[], None] = lambda: None, tick: float = 0.1):
        super().__init__(name="lanekeeper-supervisor", daemon=True)
        self.factory, self.policy, self.tick = factory, policy, tick
        self.on_give_up, self.on_restart = on_give_up, on_restart
        self.engine = None
        self.state = "starting"
        self.reason: str | None = None     # the verdict that caused the current or latest restart
        self.restarts = 0                  # engines replaced so far
        self.retry_after = 0.0             # seconds a client should wait while restarting
        self._recent: deque[float] = deque()
        self._halt = threading.Event()

    def start_engine(self) -> None:
        """Build the first engine (in the caller's thread, so a bad profile fails the server's start-up)."""
        self.engine = self.factory()
        self.state = "ok"
        self.start()

    def stop(self) -> None:
        self._halt.set()
        if self.is_alive() and self is not threading.current_thread():
            self.join(10)
        if self.engine is not None:
            self.engine.close()

    def run(self) -> None:
        while not self._halt.wait(self.tick):
            engine = self.engine
            verdict = engine.verdict() if engine is not None and not engine.closed else None
            if verdict is not None:
                self._replace(verdict.message)

    def _replace(self, reason: str) -> None:
        self.state, self.reason = "restarting", reason
        log.error("engine cannot serve: %s; replacing it", reason)
        self.engine.close(timeout=0)   # kill at once: a broken stage will not stop when asked
        while not self._halt.is_set():
            now = time.monotonic()
            while self._recent and now - self._recent[0] > self.policy.window_s:
                self._recent.popleft()
            if len(self._recent) >= self.policy.max_restarts:
                self.state = "failed"
                message = (f"{len(self._recent)} engine restart(s) in the last {self.policy.window_s:g}s "
                           f"(limit {self.policy.max_restarts}); giving up. Last failure: {reason}")
                log.error(message)
                self.on_give_up(message)
                return
            delay = self.policy.backoff(len(self._recent))
            self.retry_after = delay
            self._recent.append(now)
            if self._halt.wait(delay):
                return
            try:
                engine = self.factory()
            except Exception as e:   # a start that fails counts as a restart; the next waits longer
                reason = f"engine failed to start: {e}"
                log.error("restart %d: %s", self.restarts + 1, reason)
                self.restarts += 1
                self.on_restart()
                continue
            self.engine = engine
            self.restarts += 1
            self.on_restart()
            if self._halt.is_set():
                engine.close()
                return
            self.state = "ok"
            log.warning("engine restarted (%d so far); serving again", self.restarts)
            return
