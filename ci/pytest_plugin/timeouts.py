"""A hard timeout for every test, and the lane budget.

A test's timeout is pytest-timeout's own setting for it (its `timeout` marker, else --timeout,
PYTEST_TIMEOUT or the ini, in pytest-timeout's order), else the default of its kind (marker).  It
always uses the signal method, so that the test's JUnit record survives the timeout.

The lane budget is pytest-timeout's --session-timeout, which starts no test once it has passed;
here every test is also capped at what is left of it, so that none runs past it.
"""
from __future__ import annotations

import math
import time

import pytest
from pytest_timeout import SESSION_EXPIRE_KEY, SESSION_TIMEOUT_KEY, _get_item_settings

MARKER_TIMEOUTS = {"config": 60.0, "offline": 300.0, "online": 300.0, "gpu": 900.0}
DEFAULT_TIMEOUT = 600.0
STARTED = pytest.StashKey[float]()


def timeout_for(item) -> tuple[float, bool]:
    """Seconds (inf where pytest-timeout's setting is 0: no timeout), and whether they cover the test
    function only (pytest-timeout's func_only) or its setup and teardown too."""
    settings = _get_item_settings(item)
    if settings.timeout is not None:
        return (settings.timeout if settings.timeout > 0 else math.inf), bool(settings.func_only)
    kinds = [t for m, t in MARKER_TIMEOUTS.items() if item.get_closest_marker(m)]
    return min(kinds or [DEFAULT_TIMEOUT]), bool(settings.func_only)


def budget(config) -> float | None:
    """The lane budget in seconds (--session-timeout), if there is one."""
    return config.stash.get(SESSION_TIMEOUT_KEY, 0) or None


def budget_left(config) -> float | None:
    expire = config.stash.get(SESSION_EXPIRE_KEY, 0)
    return expire - time.time() if expire else None


def budget_exhausted(session) -> bool:
    """pytest-timeout stopped the run at the lane budget."""
    return str(session.shouldfail or "").startswith("session-timeout")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    timeout, func_only = timeout_for(item)
    left = budget_left(item.config)
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
        from _pytest.reports import TestReport

        item.ihook.pytest_runtest_logreport(report=TestReport(
            item.nodeid, item.location, {k: 1 for k in item.keywords}, "failed",
            f"interrupted: {e or 'KeyboardInterrupt'}; the run stopped here and still wrote its reports", "call"))
        raise
