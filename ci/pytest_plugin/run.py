"""What the plugin learns during one run, and the options every part of it reads."""
from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path

import pytest

from ci.argtypes import shard
from ci.matrix import CUDA_GRAPH, HANDOFFS, RUNNERS
from engine.profile_schema import BACKENDS
from engine.procs import STACK_DIR_ENV


class RunState:
    """One run's results, stalls and budget, kept in `config.stash[RUN]`."""

    def __init__(self, config):
        self.config = config
        self.started = time.monotonic()
        self.budget_hit = False
        report_dir = config.getoption("report_dir")
        self.report_dir = Path(report_dir) if report_dir else None
        self.stack_dir = Path(tempfile.mkdtemp(prefix="lanekeeper-stacks-"))
        self.incidents: list = []                          # ci.pytest_plugin.stalls.Incident, in order
        self.stalled_cells: dict[str, str] = {}            # cell id -> the diagnosis, in words
        self.unsupported: dict[str, str] | None = None     # cell id -> why the backend cannot run it here
        self.shipped = None                                # the run's profile as shipped, as a test parameter
        self.cases: dict = {}                              # node id -> its ci.junit.Case, as JUnit records it


RUN = pytest.StashKey[RunState]()


def is_worker(config) -> bool:
    """A pytest-xdist worker: it runs tests, the controller keeps the books."""
    return hasattr(config, "workerinput")


def pytest_addoption(parser):
    group = parser.getgroup("lanekeeper")
    group.addoption("--platform", default=None, help="platform to resolve profiles for (default: detected)")
    group.addoption("--profile", default="qwen3_tts",
                    help="deploy profile (name or path) the engines and servers run (default: %(default)s)")
    group.addoption("--backend", choices=BACKENDS, default="torch",
                    help="stage-0 backend the matrix runs on (default: torch, the built-in talker)")
    group.addoption("--runner", choices=RUNNERS, action="append", help="only these model runners")
    group.addoption("--cuda-graph", choices=CUDA_GRAPH, action="append", help="only these CUDA graph modes")
    group.addoption("--handoff", choices=HANDOFFS, action="append", help="only these handoff modes")
    group.addoption("--report-dir", default=os.environ.get("LANEKEEPER_REPORT_DIR"),
                    help="directory for stall-report.json/.md and matrix-summary.md")
    group.addoption("--shard", type=shard, default=None, metavar="K/N",
                    help="run only shard K of N (a matrix cell is never split across shards)")


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"received signal {signum}")


def pytest_configure(config):
    # SIGTERM (a CI agent or `lanekeeper run` stopping the lane) ends the run like ^C: fixtures
    # close their engines and the JUnit file is still written.
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)
    from engine.config import ProfileError, find_profile

    try:
        find_profile(config.getoption("profile"))
    except ProfileError as e:
        raise pytest.UsageError(f"--profile: {e}") from None
    state = RunState(config)
    config.stash[RUN] = state
    # Engine stages (here and in servers started from here) write faulthandler dumps to this directory.
    os.environ[STACK_DIR_ENV] = str(state.stack_dir)


@pytest.fixture(scope="session")
def platform(pytestconfig) -> str:
    from engine.config import detect_platform

    return pytestconfig.getoption("platform") or detect_platform()


@pytest.fixture(scope="session")
def profile_name(pytestconfig) -> str:
    """The deploy profile under test: a lane's `profile:` arrives here as --profile."""
    return pytestconfig.getoption("profile")


def pytest_unconfigure(config):
    state = config.stash.get(RUN, None)
    if state is not None:
        shutil.rmtree(state.stack_dir, ignore_errors=True)
