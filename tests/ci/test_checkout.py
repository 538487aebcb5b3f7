"""Which checkout the command line acts on: the one at or above the working directory, or --root; outside
any, the shipped profiles, and `run` refuses.

The commands run as the installed `lanekeeper` does (`python -P`: the working directory is not on the
import path), so a second clone shares this checkout's install, as it does on a CI agent that reuses a
venv or with two worktrees on a laptop.
"""
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from engine.profile.document import ProfileDoc
from tests.helpers.repo import ROOT, copy_project, git


def _cli(cwd, *args):
    env = {k: v for k, v in os.environ.items() if k not in ("LANEKEEPER_ROOT", "LANEKEEPER_PROFILES_DIR")}
    return subprocess.run([sys.executable, "-P", "-m", "ci.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=env)


CLONE_TEST = '''
from engine.profile.resolve import resolve


def test_runs_in_the_clone():
    assert resolve("qwen3_tts", platform="cpu").stage(0).max_num_seqs == 7
'''


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    """A second checkout, a git repository, whose default profile sets another batch size (pins left
    stale), with a lane and a test of its own."""
    root = tmp_path_factory.mktemp("clone")
    copy_project(root)
    git(root, "init", "-q", "-b", "main")
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base", "--allow-empty")
    git(root, "add", "-A")
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "the project")
    doc = ProfileDoc.load(root / "profiles" / "qwen3_tts.yaml")
    doc.set("stages.0.max_num_seqs", 7)
    doc.save()
    (root / "tests" / "config" / "test_clone_only.py").write_text(CLONE_TEST)
    lanes = root / "ci" / "lanes.yaml"
    lanes.write_text(lanes.read_text() + """
  - key: clone-only
    label: "Clone · only"
    trigger: per_commit
    paths: [tests/config/test_clone_only.py]
    timeout: 60
    budget: 120
""")
    git(root, "add", "-A")
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "clone's change")
    return root


def test_outside_a_checkout_run_refuses_and_profiles_come_from_the_package(tmp_path):
    run = _cli(tmp_path, "run", "tts-base", "--dry-run")
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1 and "checkout" in run.stderr
    show = _cli(tmp_path, "profile", "show", "qwen3_tts", "--platform", "cpu")
    assert show.returncode == 0 and "(package)" in show.stdout.splitlines()[0]


def test_the_checkout_you_stand_in_wins(clone):
    inside = clone / "tests" / "config"          # any directory below the checkout
    show = _cli(inside, "profile", "show", "qwen3_tts", "--platform", "cpu", "--explain")
    assert show.returncode == 0 and str(clone) in show.stdout.splitlines()[0]
    assert any(line.startswith("stages.0.max_num_seqs ") and " 7 " in line for line in show.stdout.splitlines())
    dry = _cli(inside, "run", "config", "--dry-run")
    assert dry.returncode == 0 and dry.stdout.splitlines()[0] == f"# in {clone}"


def test_pins_lanes_and_changes_are_the_clones(clone):
    stale = _cli(clone, "profile", "pin", "--check")
    assert stale.returncode == 1 and "max_num_seqs" in stale.stdout     # the clone's drift, not this checkout's
    assert _cli(ROOT, "profile", "pin", "--check").returncode == 0
    assert "clone-only" in _cli(clone, "lanes").stdout and "clone-only" not in _cli(ROOT, "lanes").stdout
    changed = _cli(clone, "pipeline", "github-lanes", "--changed-since", "HEAD~1", "--event", "pull_request",
                   "--labels", "merge-test")
    assert changed.returncode == 0, changed.stderr
    assert "changed paths 3" in changed.stderr   # the clone's last commit: a profile, a test, the lanes file


def test_run_runs_the_clones_lane_and_tests(clone):
    run = _cli(clone / "profiles", "run", "clone-only")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr
    assert f"in {clone}" in run.stdout.splitlines()[0]
    (case,) = ET.parse(clone / "artifacts" / "clone-only" / "junit.xml").getroot().iter("testcase")
    assert case.get("name") == "test_runs_in_the_clone" and case.find("failure") is None


def test_root_names_the_checkout(clone, tmp_path):
    dry = _cli(tmp_path, "--root", str(clone), "run", "config", "--dry-run")
    assert dry.returncode == 0 and dry.stdout.splitlines()[0] == f"# in {clone}"
    bad = _cli(tmp_path, "--root", str(tmp_path), "run", "config", "--dry-run")
    assert bad.returncode == 2 and "not a lanekeeper checkout" in bad.stderr
