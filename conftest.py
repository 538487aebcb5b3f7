"""Fixtures of this repository only (the plugin itself loads by its pytest11 entry point)."""
pytest_plugins = ["pytester"]

import pytest


@pytest.fixture
def pytester(pytester):
    """Projects that pytester makes run the plugin's matrix, as this repository does."""
    pytester.makeini("[pytest]\nlanekeeper_matrix = true\n")
    return pytester
