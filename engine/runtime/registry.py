"""What this process has running, and what went wrong in it: the one place the test plugin, fixtures
and leak checks look.

- `register(owner)` / `unregister(owner)`: an engine or a speech-server process registers itself
  when it starts and unregisters when it closes.  An owner has `pids()` (its processes, and what
  they started) and `kill()` (end them now, whatever their state).
- `owners()`, `owned_pids()`: what is open now; anything else of an engine's that is running was
  left behind.
- `record(diagnosis)`, `diagnoses_since(t)`: every diagnosis a watchdog made in this process, with
  when, so that a test that swallowed the exception carrying one is still reported as stalled.
- `kill_all()`: end every registered owner (the plugin, on a stall or a timeout).

Owners are held weakly: one that is garbage-collected leaves on its own.
"""
from __future__ import annotations

import collections
import threading
import time
import weakref
from typing import Protocol

from engine.diagnosis import Diagnosis


class Owner(Protocol):
    def pids(self) -> list[int]: ...
    def kill(self) -> None: ...


class Registry:
    def __init__(self, keep: int = 1000):
        self._owners: "weakref.WeakSet[Owner]" = weakref.WeakSet()
        self._diagnoses: "collections.deque[tuple[float, Diagnosis]]" = collections.deque(maxlen=keep)
        self._lock = threading.Lock()

    def register(self, owner: Owner) -> None:
        with self._lock:
            self._owners.add(owner)

    def unregister(self, owner: Owner) -> None:
        with self._lock:
            self._owners.discard(owner)

    def owners(self) -> list[Owner]:
        with self._lock:
            return list(self._owners)

    def owned_pids(self) -> set[int]:
        return {pid for owner in self.owners() for pid in owner.pids()}

    def kill_all(self) -> None:
        for owner in self.owners():
            owner.kill()

    def record(self, diagnosis: Diagnosis) -> None:
        with self._lock:
            self._diagnoses.append((time.time(), diagnosis))

    def diagnoses_since(self, t: float) -> list[Diagnosis]:
        with self._lock:
            return [d for when, d in self._diagnoses if when >= t]


REGISTRY = Registry()
