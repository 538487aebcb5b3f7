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


# Test modules whose tests each run lanes, nested pytest runs or engines of their own (ten seconds to a minute
# each on two cores), most per test first.  Named by stem: a path here would count as a file every lane reads.
LONG_FIRST = ("test_stall_lanes", "test_profile_text", "test_vllm_backend", "test_kernels", "test_lane_deps",
              "test_rollback", "test_artifacts", "test_lanes_and_pipelines")


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist, the long tests go out first and the short ones fill the end: in collection order,
    the last to go out were the vLLM backend's minute-long tests, run by one worker while the others sat
    idle.  Each worker collects, and each sorts the same way, so they agree on the order."""
    if hasattr(config, "workerinput"):
        rank = {path: i for i, path in enumerate(LONG_FIRST)}
        items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))


@pytest.fixture
def pytester(pytester, pytestconfig):
    """Projects that pytester makes run the plugin's matrix, as this repository does, and leave out the
    plugins this repository's addopts leave out: a pytester project's ini is its own, so otherwise each of
    its pytest processes (a run, its xdist workers) loads hypothesis and the rest, about 1.3 s apiece."""
    opts = pytestconfig.getini("addopts")
    off = " ".join(f"-p {name}" for flag, name in zip(opts, opts[1:]) if flag == "-p" and name.startswith("no:"))
    pytester.makeini(f"[pytest]\nlanekeeper_matrix = true\naddopts = {off}\n")
    return pytester
