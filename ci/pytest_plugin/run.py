"""What the plugin learns during one run, and the options every part of it reads.

Options are prefixed `--lk-` so that the plugin, which loads in every project that installs
lanekeeper, never collides with another plugin's (pytest-profiling has `--profile`).  The matrix
(`cell` and `shipped` parametrisation, the profile and its axes) is on only where a project asks
for it with the ini option `lanekeeper_matrix = true`, as this repository does.
"""
from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path

import pytest

from ci.matrix import CUDA_GRAPH, HANDOFFS, RUNNERS
from ci.run.record import new_run_id
from engine.process.stacks import STACK_DIR_ENV
from engine.profile.schema import BACKENDS
from engine.serve.argtypes import shard


class RunState:
    """One run's results, stalls and budget, kept in `config.stash[RUN]`."""

    def __init__(self, config):
        self.config = config
        self.started = time.time()
        self.budget_hit = False
        self.run_id = new_run_id()   # shared by the shards of one build (`lanekeeper run` sets LANEKEEPER_RUN_ID)
        report_dir = config.getoption("lk_report_dir")
        self.report_dir = Path(report_dir) if report_dir else None
        self.stack_dir = Path(tempfile.mkdtemp(prefix="lanekeeper-stacks-"))
        self.incidents: list = []                          # ci.pytest_plugin.stalls.Incident, in order
        self.stalled_cells: dict[str, str] = {}            # cell id -> the diagnosis, in words
        self.unsupported: dict[str, str] | None = None     # cell id -> why the backend cannot run it here
        self.shipped = None                                # the run's profile as shipped, as a test parameter
        self.cases: dict = {}                              # node id -> its ci.run.report.Case, as JUnit records it


RUN = pytest.StashKey[RunState]()


def is_worker(config) -> bool:
    """A pytest-xdist worker: it runs tests, the controller keeps the books."""
    return hasattr(config, "workerinput")


def matrix_on(config) -> bool:
    return bool(config.getini("lanekeeper_matrix"))


def pytest_addoption(parser):
    parser.addini("lanekeeper_matrix", type="bool", default=False,
                  help="parametrise tests that take `cell` or `shipped` over the runner x graph x handoff matrix")
    parser.addini("lanekeeper_timeouts", type="linelist", default=[],
                  help="default hard timeouts by marker, as MARKER=SECONDS lines (default=SECONDS for the rest); "
                       "pytest-timeout's own settings win over them")
    group = parser.getgroup("lanekeeper")
    group.addoption("--lk-platform", default=None, help="platform to resolve profiles for (default: detected)")
    group.addoption("--lk-profile", default="qwen3_tts",
                    help="deploy profile (name or path) the engines and servers run (default: %(default)s)")
    group.addoption("--lk-backend", choices=BACKENDS, default="torch",
                    help="stage-0 backend the matrix runs on (default: torch, the built-in talker)")
    group.addoption("--lk-runner", choices=RUNNERS, action="append", help="only these model runners")
    group.addoption("--lk-cuda-graph", choices=CUDA_GRAPH, action="append", help="only these CUDA graph modes")
    group.addoption("--lk-handoff", choices=HANDOFFS, action="append", help="only these handoff modes")
    group.addoption("--lk-report-dir", default=os.environ.get("LANEKEEPER_REPORT_DIR"),
                    help="directory for stall-report.json/.md and matrix-summary.md")
    group.addoption("--lk-set", action="append", metavar="KEY=VALUE",
                    help="a profile setting every engine and server of the matrix applies on top of its cell "
                         "(repeatable), e.g. watchdog.handoff_deadline_s=2")
    group.addoption("--lk-shard", type=shard, default=None, metavar="K/N",
                    help="run only shard K of N (a matrix cell is never split across shards)")


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"received signal {signum}")


def pytest_configure(config):
    # SIGTERM (a CI agent or `lanekeeper run` stopping the lane) ends the run like ^C: fixtures
    # close their engines and the JUnit file is still written.
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)
    if matrix_on(config):
        from engine.profile.resolve import ProfileError, find_profile, resolve

        try:
            find_profile(config.getoption("lk_profile"))
        except ProfileError as e:
            raise pytest.UsageError(f"--lk-profile: {e}") from None
        try:
            if config.getoption("lk_set"):   # refused here once, not by every engine of the run
                resolve(config.getoption("lk_profile"), platform=config.getoption("lk_platform"),
                        overrides=config.getoption("lk_set"))
        except ProfileError as e:
            raise pytest.UsageError(f"--lk-set: {e}") from None
    state = RunState(config)
    config.stash[RUN] = state
    # Engine stages (here and in servers started from here) write faulthandler dumps to this directory.
    os.environ[STACK_DIR_ENV] = str(state.stack_dir)


@pytest.fixture(scope="session")
def platform(pytestconfig) -> str:
    from engine.profile.resolve import detect_platform

    return pytestconfig.getoption("lk_platform") or detect_platform()


@pytest.fixture(scope="session")
def profile_name(pytestconfig) -> str:
    """The deploy profile under test: a lane's `profile:` arrives here as --lk-profile."""
    return pytestconfig.getoption("lk_profile")


def pytest_unconfigure(config):
    state = config.stash.get(RUN, None)
    if state is not None:
        shutil.rmtree(state.stack_dir, ignore_errors=True)
