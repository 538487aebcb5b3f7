"""Fixtures of this repository only (the plugin itself loads by its pytest11 entry point)."""
pytest_plugins = ["pytester"]

import os

import pytest


def pytest_configure(config):
    """Under pytest-xdist, each worker (and every process it starts) computes on one thread.  The workers
    outnumber the cores, and a torch thread pool that spans cores others hold keeps waiting at its
    barriers: on a 2-core machine, the suite on three workers took 1,140-1,200 CPU-s (640-660 s) with
    two threads a worker and 860 CPU-s (498 s) with one, in one session.  An OMP_NUM_THREADS already
    set wins.  Set here, in the controller, before its workers start: they and their children inherit it."""
    if getattr(config.option, "numprocesses", None) and "PYTEST_XDIST_WORKER" not in os.environ:
        os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture
def pytester(pytester):
    """Projects that pytester makes run the plugin's matrix, as this repository does."""
    pytester.makeini("[pytest]\nlanekeeper_matrix = true\n")
    return pytester
