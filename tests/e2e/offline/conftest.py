import pytest

from ci.matrix import TEST_WATCHDOG
from engine.profile.resolve import resolve
from engine.runtime.engine import TTSEngine
from tests.helpers.reference import reference_runs
from tests.helpers.speech_requests import make_request


@pytest.fixture(scope="session")
def offline_engine(cell, platform, profile_name):
    """One engine per matrix cell, shared by every test of that cell: the lane's profile with the
    cell's axes set on top."""
    profile = resolve(profile_name, platform=platform, overrides=TEST_WATCHDOG + cell.overrides)
    with TTSEngine(profile) as engine:
        yield engine


@pytest.fixture(scope="session")
def shipped_engine(shipped):
    """The lane's profile exactly as shipped (only the test watchdog and the lane's backend set):
    its own runner, graphs and handoff, the cell a default flip changes."""
    with TTSEngine(shipped) as engine:
        yield engine


@pytest.fixture(scope="session")
def greedy_reference(ref_audio, pytestconfig):
    tasks = ("CustomVoice", "VoiceDesign", "Base")
    reqs = [make_request(task, "Greedy codes must match everywhere.", ref_audio, temperature=0.0, seed=7)
            for task in tasks]
    runs = reference_runs(reqs, backend=pytestconfig.getoption("lk_backend"), profile_name=pytestconfig.getoption("lk_profile"))
    return {task: (req, *run) for task, req, run in zip(tasks, reqs, runs)}


