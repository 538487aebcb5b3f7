"""A hard timeout for every test that has one, and the lane budget.

A test's timeout is pytest-timeout's setting for it, read from pytest-timeout's documented sources in
its documented order (the `timeout` marker, `--timeout`, `PYTEST_TIMEOUT`, the ini `timeout`); where
none is set, a project may give defaults by marker (ini `lanekeeper_timeouts`).  It always uses the
signal method, so that the test's JUnit record survives the timeout.

The lane budget is pytest-timeout's `--session-timeout` (or ini `session_timeout`), which starts no test
once it has passed; here every test is also capped at what is left of it, so that none runs past it.
"""
from __future__ import annotations

import math
import os
import time

import pytest

from ci.pytest_plugin.run import RUN

STARTED = pytest.StashKey[float]()
BUDGET_HIT = pytest.StashKey[bool]()
TIMER = pytest.StashKey[tuple[float, float]]()   # (seconds, when they run out) of the test's running timer


def _seconds(value) -> float | None:
    return None if value in (None, "") else float(value)


def marker_settings(item) -> tuple[float | None, bool | None]:
    """(timeout, func_only) of the test's own `timeout` marker, each None where it does not say."""
    marker = item.get_closest_marker("timeout")
    if marker is None:
        return None, None
    timeout = marker.kwargs.get("timeout", marker.args[0] if marker.args else None)
    return _seconds(timeout), marker.kwargs.get("func_only")


def kind_defaults(config) -> dict[str, float]:
    """MARKER=SECONDS lines of the ini `lanekeeper_timeouts` (`default=` for tests of no listed kind)."""
    out = {}
    for line in config.getini("lanekeeper_timeouts"):
        kind, eq, seconds = line.partition("=")
        if not eq:
            raise pytest.UsageError(f"ini lanekeeper_timeouts: {line!r} is not MARKER=SECONDS")
        try:
            out[kind.strip()] = float(seconds)
        except ValueError:
            raise pytest.UsageError(f"ini lanekeeper_timeouts: {line!r}: {seconds!r} is not a number") from None
    return out


def timeout_for(item) -> tuple[float, bool]:
    """Seconds (inf for none: pytest-timeout's 0 included), and whether they cover the test function only
    (pytest-timeout's func_only) or its setup and teardown too."""
    config = item.config
    timeout, func_only = marker_settings(item)
    for source in (lambda: config.getoption("timeout"), lambda: os.environ.get("PYTEST_TIMEOUT"),
                   lambda: config.getini("timeout")):
        if timeout is None:
            timeout = _seconds(source())
    if func_only is None:
        func_only = bool(config.getini("timeout_func_only"))
    if timeout is None:
        defaults = kind_defaults(config)
        kinds = [t for kind, t in defaults.items() if kind != "default" and item.get_closest_marker(kind)]
        timeout = min(kinds) if kinds else defaults.get("default")
    return (timeout if timeout else math.inf), func_only


def budget(config) -> float | None:
    """The lane budget in seconds (pytest-timeout's --session-timeout or ini session_timeout), if any."""
    value = config.getoption("session_timeout") or _seconds(config.getini("session_timeout"))
    return value or None


def budget_left(config, started: float) -> float | None:
    total = budget(config)
    return None if total is None else started + total - time.time()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    started = item.config.stash[RUN].started
    timeout, func_only = timeout_for(item)
    left = budget_left(item.config, started)
    if left is not None:
        timeout = max(1.0, min(timeout, left))
    if math.isfinite(timeout):   # the closest marker, which pytest-timeout reads when the test starts
        item.add_marker(pytest.mark.timeout(timeout, method="signal", func_only=func_only), append=False)
    item.stash[STARTED] = time.time()
    try:
        return (yield)
    except KeyboardInterrupt as e:
        # ^C or SIGTERM mid-test: the test it cut short still gets a JUnit record, an error that says so
        # (pytest's JUnit writer records only phases that finished).
        item.ihook.pytest_runtest_logreport(report=pytest.TestReport(
            item.nodeid, item.location, {k: 1 for k in item.keywords}, "failed",
            f"interrupted: {e or 'KeyboardInterrupt'}; the run stopped here and still wrote its reports", "call"))
        raise
    finally:
        left = budget_left(item.config, started)
        if left is not None and left <= 0:   # pytest-timeout stops the run here: the budget is spent
            item.config.stash[BUDGET_HIT] = True


def budget_exhausted(config) -> bool:
    """A test here ran into the budget, or the run outlived it.  Under xdist the controller, which starts
    first, can reach the end of its budget and stop the run before any worker reports reaching its own."""
    if config.stash.get(BUDGET_HIT, False):
        return True
    left = budget_left(config, config.stash[RUN].started)
    return left is not None and left <= 0


@pytest.hookimpl(wrapper=True, optionalhook=True)
def pytest_timeout_set_timer(item, settings):
    """pytest-timeout starts the test's timer: note when it runs out, to know a timeout when it fails."""
    item.stash[TIMER] = (settings.timeout, time.monotonic() + settings.timeout)
    return (yield)


def timed_out(item, exc) -> float | None:
    """The hard timeout (seconds) this failure is, or None: pytest-timeout fails a test with pytest.fail
    from its timer, so a `pytest.fail` at or after the timer ran out is the timeout."""
    timer = item.stash.get(TIMER, None)
    if timer is None or not isinstance(exc, pytest.fail.Exception) or time.monotonic() < timer[1] - 0.05:
        return None
    return timer[0]
