"""The matrix cells a test runs in: a test that takes `cell` runs once per selected cell, one that takes
`shipped` once, on the run's profile as shipped.  Both are session-scoped, so one engine or server
serves all of a cell's tests."""
from __future__ import annotations

import pytest

from ci.matrix import CUDA_GRAPH, HANDOFFS, RUNNERS, TEST_WATCHDOG, cells
from ci.pytest_plugin.run import RUN, matrix_on
from ci.run.junit import TASK_PROPERTY


def selected_cells(config):
    return cells(config.getoption("lk_runner") or RUNNERS, config.getoption("lk_cuda_graph") or CUDA_GRAPH,
                 config.getoption("lk_handoff") or HANDOFFS, config.getoption("lk_backend"),
                 tuple(config.getoption("lk_set") or ()))


def unsupported_cells(config, chosen) -> dict[str, str]:
    """Cells the backend cannot run on this platform, with the backend's own reason (asked once a run)."""
    if config.getoption("lk_backend") != "vllm":
        return {}
    state = config.stash[RUN]
    if state.unsupported is None:
        from engine.profile.resolve import detect_platform, resolve
        from engine.stage0.vllm_backend import unsupported

        platform = config.getoption("lk_platform") or detect_platform()
        state.unsupported = {}
        for cell in chosen:
            reason = unsupported(resolve(config.getoption("lk_profile"), platform=platform, overrides=cell.overrides))
            if reason:
                state.unsupported[cell.id] = reason
    return state.unsupported


def shipped_profile(config):
    """The run's profile as shipped: only the test watchdog, the run's stage-0 backend and its own settings
    (--lk-set) set on it."""
    from engine.profile.resolve import detect_platform, resolve

    backend = config.getoption("lk_backend")
    return resolve(config.getoption("lk_profile"), platform=config.getoption("lk_platform") or detect_platform(),
                   overrides=TEST_WATCHDOG + ([f"backend={backend}"] if backend != "torch" else [])
                   + (config.getoption("lk_set") or []))


def pytest_generate_tests(metafunc):
    if not matrix_on(metafunc.config):
        return
    if "shipped" in metafunc.fixturenames:
        state = metafunc.config.stash[RUN]
        if state.shipped is None:   # resolved (and asked of vLLM) once a run
            profile, marks = shipped_profile(metafunc.config), []
            if profile.config.backend == "vllm":
                from engine.stage0.vllm_backend import unsupported

                reason = unsupported(profile)
                marks = [pytest.mark.skip(reason=reason)] if reason else []
            # The id carries the cell the profile's own defaults make, so the matrix summary and repro see it.
            state.shipped = pytest.param(profile, id=f"{profile.name}-{profile.cell}", marks=marks)
        metafunc.parametrize("shipped", [state.shipped], scope="session")
    if "cell" in metafunc.fixturenames:
        chosen = selected_cells(metafunc.config)
        skips = unsupported_cells(metafunc.config, chosen)
        params = [pytest.param(c, id=c.id, marks=[pytest.mark.skip(reason=skips[c.id])] if c.id in skips else [])
                  for c in chosen]
        metafunc.parametrize("cell", params, scope="session")


def cell_of(item) -> str | None:
    """The matrix cell a test runs in: its `cell`, or the cell its profile as shipped makes."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    if "shipped" in params:
        return params["shipped"].cell
    return getattr(params.get("cell"), "id", None)


def pytest_configure(config):
    config.addinivalue_line("markers", "task(name): the task type a matrix test exercises (CustomVoice, "
                                       "VoiceDesign, Base); the summary's matrix groups by it")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """The test's task goes with every report of it, and into its JUnit record."""
    marker = item.get_closest_marker("task")
    if marker is not None:
        item.user_properties.append((TASK_PROPERTY, marker.args[0]))


def task_of(report) -> str | None:
    return next((value for name, value in getattr(report, "user_properties", ()) if name == TASK_PROPERTY), None)
