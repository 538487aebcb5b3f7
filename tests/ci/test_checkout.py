"""Which checkout the command line acts on: the one at or above the working directory, or --root; outside
any, the shipped profiles, and `run` refuses."""
import os
import subprocess
import sys

import pytest

from engine.profile.document import ProfileDoc
from tests.helpers.repo import copy_project


def _cli(cwd, *args):
    env = {k: v for k, v in os.environ.items() if k not in ("LANEKEEPER_ROOT", "LANEKEEPER_PROFILES_DIR")}
    return subprocess.run([sys.executable, "-m", "ci.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env=env)


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    """A second checkout whose default profile sets another batch size."""
    root = tmp_path_factory.mktemp("clone")
    copy_project(root)
    doc = ProfileDoc.load(root / "profiles" / "qwen3_tts.yaml")
    doc.set("stages.0.max_num_seqs", 7)
    doc.save()
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


def test_root_names_the_checkout(clone, tmp_path):
    dry = _cli(tmp_path, "--root", str(clone), "run", "config", "--dry-run")
    assert dry.returncode == 0 and dry.stdout.splitlines()[0] == f"# in {clone}"
    bad = _cli(tmp_path, "--root", str(tmp_path), "run", "config", "--dry-run")
    assert bad.returncode == 2 and "not a lanekeeper checkout" in bad.stderr
