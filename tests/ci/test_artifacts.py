"""A run's artifacts describe that run alone: `lanekeeper run` clears what an earlier run left, and
`report` refuses to merge one lane's results from different runs."""
import os
import subprocess
import sys

import pytest

from ci.run import record
from tests.helpers.lanes import one_lane_file
from tests.helpers.repo import ROOT

FAULT = "drop_handoff:after_frames=2"


def _cli(*args, env=None):
    env = {k: v for k, v in {**os.environ, **(env or {})}.items() if v is not None}
    return subprocess.run([sys.executable, "-m", "ci.cli", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, env=env, timeout=300)


def test_a_green_run_after_a_stalled_one_reports_green(tmp_path):
    lanes = one_lane_file(tmp_path, "clean", "as_shipped")
    art = tmp_path / "art"
    red = _cli("run", "clean", "--lanes-file", lanes, "--artifacts", art, env={"LANEKEEPER_FAULTS": FAULT})
    assert red.returncode == 1, red.stdout[-2000:]
    assert (art / "stall-report.md").exists()
    assert _cli("report", "--junit", art).returncode == 1

    green = _cli("run", "clean", "--lanes-file", lanes, "--artifacts", art, env={"LANEKEEPER_FAULTS": None})
    assert green.returncode == 0, green.stdout[-2000:]
    assert not (art / "stall-report.md").exists() and not (art / "stall-report.json").exists()
    report = _cli("report", "--junit", art)
    assert report.returncode == 0, report.stdout + report.stderr
    assert report.stdout.startswith("**green**: 1 passed")
    assert "Stall report" not in report.stdout and "Stalled cells" not in report.stdout

    # one shard of the lane into the same directory: the whole run's files go, the shard's stay apart
    shard = _cli("run", "clean", "--lanes-file", lanes, "--artifacts", art, "--shard", "1/2", "--dry-run")
    assert shard.returncode == 0 and str(art / "shard-1-of-2") in shard.stdout
    (art / "keep.txt").write_text("not ours")
    _cli("run", "clean", "--lanes-file", lanes, "--artifacts", art, "--shard", "2/2")
    assert not (art / "junit.xml").exists() and not (art / record.RECORD_FILE).exists()
    assert (art / "shard-2-of-2" / "junit.xml").exists() and (art / "keep.txt").exists()


JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="wide"><testcase classname="tests.t" name="test_{n}"/></testsuite></testsuites>"""


def _result(directory, n, run_id, shard=None):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "junit.xml").write_text(JUNIT.format(n=n))
    record.write(directory, record.RunRecord(run_id=run_id, lane="wide", shard=shard))


@pytest.mark.parametrize("layout", ["whole beside shards", "shards of two runs", "two splits", "a shard twice"])
def test_report_refuses_results_of_one_lane_from_different_runs(tmp_path, layout):
    art = tmp_path / "wide"
    _result(art / "shard-1-of-2", 1, "b", "1/2")
    _result(art / "shard-2-of-2", 2, "b" if layout != "shards of two runs" else "a", "2/2")
    if layout == "whole beside shards":
        _result(art, 0, "b")
    elif layout == "two splits":
        _result(art / "shard-3-of-3", 3, "b", "3/3")
    elif layout == "a shard twice":
        _result(art / "copy", 3, "b", "2/2")
    run = _cli("report", "--junit", art)
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert "wide" in run.stderr and "Traceback" not in run.stderr


def test_report_merges_the_shards_of_one_run_and_keeps_lanes_apart(tmp_path):
    _result(tmp_path / "wide" / "shard-1-of-2", 1, "b", "1/2")
    _result(tmp_path / "wide" / "shard-2-of-2", 2, "b", "2/2")
    _result(tmp_path / "other", 3, "c")
    (tmp_path / "other" / record.RECORD_FILE).write_text(
        record.RunRecord(run_id="c", lane="other").model_dump_json())
    run = _cli("report", "--junit", tmp_path / "wide", tmp_path / "other")
    assert run.returncode == 0 and run.stdout.startswith("**green**: 3 passed"), run.stderr


def test_the_run_id_is_the_builds(monkeypatch):
    """Shards of one CI build share it; a local run without LANEKEEPER_RUN_ID has its own."""
    assert record.new_run_id({"BUILDKITE_BUILD_ID": "x"}) == record.new_run_id({"BUILDKITE_BUILD_ID": "x"})
    assert record.new_run_id({"GITHUB_RUN_ID": "7"}) == record.new_run_id({"GITHUB_RUN_ID": "7"})
    assert record.new_run_id({}) != record.new_run_id({})
    assert record.new_run_id({record.RUN_ID_ENV: "mine", "BUILDKITE_BUILD_ID": "x"}) == "mine"


def test_annotate_without_buildkite_agent_prints_and_says_so(tmp_path):
    _result(tmp_path / "wide", 1, "b")
    bare = tmp_path / "bin"   # a PATH without buildkite-agent (python is run by its full path)
    bare.mkdir()
    run = _cli("report", "--junit", tmp_path / "wide", "--annotate", env={"PATH": str(bare)})
    assert run.returncode == 0 and run.stdout.startswith("**green**: 1 passed"), run.stderr
    (line,) = run.stderr.strip().splitlines()
    assert "buildkite-agent" in line
