"""An engine process (a stage, vLLM's engine core or a worker, a speech server) that no open engine or
live server owns when a test ends is killed, and the test errors: it left a process behind."""
from __future__ import annotations

import psutil
import pytest

from engine.process.tree import ended, engine_processes, kill_tree
from engine.runtime.registry import REGISTRY


def stray_engine_processes() -> list[psutil.Process]:
    owned = REGISTRY.owned_pids()
    stray = []
    for proc in engine_processes():
        try:
            if proc.pid in owned or ended(proc):
                continue
            if any(p.pid in owned for p in proc.parents()):
                continue
            stray.append(proc)
        except psutil.NoSuchProcess:
            continue
    return stray


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    result = yield
    stray = stray_engine_processes()
    if stray:
        desc = ", ".join(f"pid {p.pid}" for p in stray)
        kill_tree(stray)
        raise AssertionError(f"engine processes outlived {item.nodeid} (killed now): {desc}")
    return result
