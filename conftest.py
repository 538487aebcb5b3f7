"""Loads lanekeeper's pytest plugin for every test run from the repository root."""
pytest_plugins = ["ci.pytest_plugin", "pytester"]
