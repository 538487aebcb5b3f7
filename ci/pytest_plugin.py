"""lanekeeper's pytest plugin.

- Matrix options (`--platform`, `--runner`, `--cuda-graph`, `--handoff`) narrow the
  runner x graph x handoff matrix; a test asks for the `cell` argument to be run once
  per selected cell.  Cells are session-scoped, so pytest groups every test of one
  cell together and one engine serves them all.
- The engine-process guard: after each test, any engine stage process that no open
  engine owns is killed and the test errors.  A test cannot leave a process behind
  unnoticed.
"""
from __future__ import annotations

import os

import psutil
import pytest

from ci.matrix import CUDA_GRAPH, HANDOFFS, RUNNERS, cells


def pytest_addoption(parser):
    group = parser.getgroup("lanekeeper")
    group.addoption("--platform", default=None, help="platform to resolve profiles for (default: detected)")
    group.addoption("--runner", choices=RUNNERS, action="append", help="only these model runners")
    group.addoption("--cuda-graph", choices=CUDA_GRAPH, action="append", help="only these CUDA graph modes")
    group.addoption("--handoff", choices=HANDOFFS, action="append", help="only these handoff modes")


def selected_cells(config):
    return cells(config.getoption("runner") or RUNNERS, config.getoption("cuda_graph") or CUDA_GRAPH,
                 config.getoption("handoff") or HANDOFFS)


def pytest_generate_tests(metafunc):
    if "cell" in metafunc.fixturenames:
        chosen = selected_cells(metafunc.config)
        metafunc.parametrize("cell", chosen, ids=[c.id for c in chosen], scope="session")


@pytest.fixture(scope="session")
def platform(pytestconfig) -> str:
    from engine.config import detect_platform

    return pytestconfig.getoption("platform") or detect_platform()


# ------------------------------------------------------------ process guard

def _stray_engine_processes() -> list[psutil.Process]:
    from ci.remote_server import live_server_pids
    from engine.engine import live_engine_pids

    owned = live_engine_pids() | live_server_pids()
    stray = []
    for proc in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(proc.cmdline())
            if "multiprocessing.spawn" not in cmd or "resource_tracker" in cmd:
                continue
            if proc.pid in owned or proc.status() == psutil.STATUS_ZOMBIE:
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
    stray = _stray_engine_processes()
    if stray:
        desc = ", ".join(f"pid {p.pid}" for p in stray)
        for proc in stray:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(stray, timeout=5)
        raise AssertionError(f"engine processes outlived {item.nodeid} (killed now): {desc}")
    return result
