"""A lane spread out: pytest-xdist workers on one machine, --shard K/N across agents."""
import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from ci.run import ci_api
from ci.lanes import github as github_workflows
from ci.rollback import history
from ci.run import junit
from ci.lanes import schema as lanes
from ci.lanes import buildkite as pipelines
from ci.rollback.history import Build, LaneResult
from ci.matrix import cell_in, cells
from ci.pytest_plugin.shards import split
from tests.helpers.fake_ci import TOKEN

MATRIX = """
    import pytest

    def test_text(cell):
        pass

    def test_voice_design(cell):
        pass

    def test_voice_clone(cell):
        if cell.handoff == "full_payload" and cell.runner == "v1":
            pytest.fail("clone broke on v1 full_payload")

    @pytest.mark.parametrize("i", range(5))
    def test_plain(i):
        pass

    def test_skipped(cell):
        if cell.runner == "v2":
            pytest.skip("not on v2")
"""


def _ids() -> list[str]:
    ids = [f"tests/e2e/offline/test_{m}.py::test_{t}[{c.id}]" for m in ("a", "b") for t in ("x", "y")
           for c in cells()]
    ids += [f"tests/e2e/online/test_c.py::test_z[CustomVoice-{c.id}]" for c in cells()]
    return ids + [f"tests/ci/test_d.py::test_{i}" for i in range(11)]


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_shards_are_disjoint_cover_the_selection_and_never_split_a_cell(n):
    ids = _ids()
    shards = split(ids, n)
    flat = [i for s in shards for i in s]
    assert sorted(flat) == sorted(ids) and len(flat) == len(set(flat))
    owner = {}
    for k, shard in enumerate(shards):
        for nodeid in shard:
            cell = cell_in(nodeid)
            if cell:
                assert owner.setdefault(cell, k) == k, f"cell {cell} split across shards"
    sizes = [len(s) for s in shards]
    assert max(sizes) - min(sizes) <= 5, sizes   # a cell here is 5 tests: balanced to within one cell


def test_the_split_does_not_depend_on_collection_order():
    ids = _ids()
    shuffled = ids[:]
    random.Random(7).shuffle(shuffled)
    assert [sorted(s) for s in split(ids, 3)] == [sorted(s) for s in split(shuffled, 3)]


def _summary(pytester, *args):
    result = pytester.runpytest_subprocess("--lk-report-dir", "reports", *args)
    text = (pytester.path / "reports" / "matrix-summary.md").read_text()
    return result, text


def test_workers_report_what_a_serial_run_reports(pytester):
    pytester.makepyfile(test_matrix=MATRIX)
    serial, expected = _summary(pytester)
    assert serial.ret == 1
    parallel, got = _summary(pytester, "-n", "2")
    assert parallel.ret == 1
    assert got == expected
    assert "No matrix tests ran" not in got
    parallel.stdout.fnmatch_lines(["*lanekeeper summary*", "*31 passed, 2 failed, 0 stalled, 4 skipped*"])


def test_shards_together_run_what_one_run_runs(pytester):
    pytester.makepyfile(test_matrix=MATRIX)
    whole = pytester.runpytest_subprocess("--collect-only", "-q")
    every = {line for line in whole.outlines if "::" in line}
    seen = []
    for k in (1, 2):
        part = pytester.runpytest_subprocess("--collect-only", "-q", "--lk-shard", f"{k}/2")
        seen.append({line for line in part.outlines if "::" in line})
    assert seen[0] and seen[1] and not seen[0] & seen[1] and seen[0] | seen[1] == every
    for cell in {cell_in(i) for i in every if cell_in(i)}:
        assert sum(any(cell in i for i in s) for s in seen) == 1, cell


@pytest.mark.parametrize("spec", ["0/2", "3/2", "1", "a/b", "1/0"])
def test_a_bad_shard_is_a_usage_error(pytester, spec):
    pytester.makepyfile(test_one="def test_one():\n    pass\n")
    result = pytester.runpytest_subprocess("--lk-shard", spec)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert re.search(r"--lk-shard: .*expected K/N", "\n".join(result.errlines)), result.errlines


def test_budget_hit_in_a_worker_makes_the_run_red(pytester):
    pytester.makepyfile(test_slow="""
        import time
        import pytest

        @pytest.mark.parametrize("i", range(8))
        def test_slow(i):
            time.sleep(1)
    """)
    result = pytester.runpytest_subprocess("-n", "2", "--session-timeout", "2.5",
                                           "--lk-report-dir", "reports")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert re.search(r"Lane budget of \d+s exhausted", (pytester.path / "reports" / "matrix-summary.md").read_text())


# ------------------------------------------------------------------ lanes, pipelines, reports, history

ROOT = Path(__file__).resolve().parents[2]
SHARDED = """\
lanes:
  - key: wide
    label: "TTS · Wide"
    trigger: merge_only
    paths: [tests/e2e/offline]
    markers: merge_only
    timeout: 300
    budget: 1200
    shards: 2
    workers: 2
"""


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "ci.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=300)


@pytest.fixture
def sharded(tmp_path):
    path = tmp_path / "lanes.yaml"
    path.write_text(SHARDED)
    return path


def test_a_sharded_lane_runs_its_shard_with_its_workers(sharded):
    explicit = _cli("run", "wide", "--shard", "2/2", "--dry-run", "--lanes-file", str(sharded))
    assert explicit.returncode == 0, explicit.stderr
    assert "-n 2 --lk-shard 2/2" in explicit.stdout and "artifacts/wide/shard-2-of-2/junit.xml" in explicit.stdout
    # on Buildkite the parallel job says which shard (0-based)
    agent = _cli("run", "wide", "--dry-run", "--lanes-file", str(sharded),
                 env={"BUILDKITE_PARALLEL_JOB": "1", "BUILDKITE_PARALLEL_JOB_COUNT": "2"})
    assert agent.stdout == explicit.stdout
    whole = _cli("run", "wide", "--dry-run", "--lanes-file", str(sharded))
    assert "--lk-shard" not in whole.stdout and "artifacts/wide/junit.xml" in whole.stdout
    bad = _cli("run", "wide", "--dry-run", "--lanes-file", str(sharded),
               env={"BUILDKITE_PARALLEL_JOB": "2", "BUILDKITE_PARALLEL_JOB_COUNT": "2"})
    assert bad.returncode == 2 and "BUILDKITE_PARALLEL_JOB='2'" in bad.stderr
    usage = _cli("run", "wide", "--shard", "3/2", "--dry-run", "--lanes-file", str(sharded))
    assert usage.returncode == 2 and "--shard" in usage.stderr


@pytest.mark.parametrize("text,message", [("shards: 0", "shards"), ("workers: 0", "workers must be at least 1"),
                                          ("workers: many", "workers")])
def test_bad_shards_or_workers(tmp_path, text, message):
    path = tmp_path / "lanes.yaml"
    path.write_text(SHARDED.replace("shards: 2", text) if text.startswith("shards") else
                    SHARDED.replace("workers: 2", text))
    run = _cli("lanes", "--lanes-file", str(path))
    assert run.returncode == 2 and message in run.stderr and "lanes.yaml:" in run.stderr, run.stderr


def test_pipelines_carry_the_shards(sharded, tmp_path):
    (lane,) = lanes.load(sharded)
    main = pipelines.Build("push", "main")
    step = next(s for s in pipelines.buildkite([lane], main)["steps"] if s.get("key") == "wide")
    assert step["parallelism"] == 2 and step["artifact_paths"] == ["artifacts/wide/**/*"]
    summary = next(s for s in pipelines.buildkite([lane], main)["steps"] if s.get("key") == "matrix-summary")
    assert "'artifacts/**/junit.xml'" in summary["command"] and "report --junit artifacts --annotate" in summary["command"]
    path = tmp_path / "bk.yml"
    path.write_text(pipelines.dump(pipelines.buildkite([lane], main), "buildkite"))
    run = subprocess.run(["check-jsonschema", "--builtin-schema", "vendor.buildkite", str(path)], capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    jobs = github_workflows.lane_matrix([lane], main)["cpu"]
    assert [(j["label"], j["shard"], j["artifact"]) for j in jobs] == [
        ("TTS · Wide (shard 1/2)", "1/2", "wide-shard-1-of-2"), ("TTS · Wide (shard 2/2)", "2/2", "wide-shard-2-of-2")]
    wf = YAML(typ="safe").load((ROOT / ".github/workflows/lanes.yml").read_text())
    steps = {s.get("name"): s for s in wf["jobs"]["cpu-lanes"]["steps"]}
    assert '--shard "$SHARD"' in steps["Run lane"]["run"] and wf["jobs"]["cpu-lanes"]["env"]["SHARD"]
    assert steps["Upload artifacts"]["with"]["name"] == "${{ matrix.lane.artifact }}"


def test_report_merges_the_shards_of_a_lane(pytester):
    """Two shards' JUnit files, given as their lane's artifact directory, report as the whole run does."""
    pytester.makepyfile(test_matrix=MATRIX)
    base = ["-o", "junit_suite_name=wide"]
    pytester.runpytest_subprocess(*base, "--junitxml", "whole/junit.xml")
    for k in (1, 2):
        pytester.runpytest_subprocess(*base, "--lk-shard", f"{k}/2", "--junitxml", f"wide/shard-{k}-of-2/junit.xml")
    whole = _cli("report", "--junit", str(pytester.path / "whole/junit.xml"))
    merged = _cli("report", "--junit", str(pytester.path / "wide"))
    assert merged.returncode == whole.returncode == 1, merged.stderr   # two tests fail: the run was red
    assert merged.stdout == whole.stdout and "31 passed, 2 failed, 0 stalled, 4 skipped" in merged.stdout
    (pytester.path / "nothing-here").mkdir()
    empty = _cli("report", "--junit", str(pytester.path / "nothing-here"))
    assert empty.returncode == 2 and "no junit.xml under this directory" in empty.stderr


def test_repro_reruns_one_shards_failed_ids(pytester, api):
    """`repro --shard K/N` takes the failed ids of shard K alone: from a lane's artifact directory, and from
    Buildkite, where a sharded lane's parallel jobs share one label."""
    pytester.makepyfile(test_matrix=MATRIX.replace('cell.handoff == "full_payload" and cell.runner == "v1"', "True"))
    base = ["-o", "junit_suite_name=wide"]
    failed = {}
    for k in (1, 2):
        pytester.runpytest_subprocess(*base, "--lk-shard", f"{k}/2", "--junitxml", f"wide/shard-{k}-of-2/junit.xml")
        cases = junit.parse(pytester.path / f"wide/shard-{k}-of-2/junit.xml")
        failed[k] = sorted(c.name for c in cases if c.status == "failed")
    assert failed[1] and failed[2] and not set(failed[1]) & set(failed[2])

    def reproduced(run):
        assert run.returncode == 0, run.stderr
        listed = [line.strip() for line in run.stdout.splitlines() if line.startswith("  ")]
        return sorted(nodeid.split("::")[-1] for nodeid in listed)

    for k in (1, 2):
        run = _cli("repro", "--junit", str(pytester.path / "wide"), "--shard", f"{k}/2", "--dry-run")
        assert f"reproducing {len(failed[k])} failed test(s)" in run.stdout
        assert reproduced(run) == failed[k]
        assert "--lk-shard" not in run.stdout.splitlines()[-1]   # exactly those ids, whatever shard they came from
    missing = _cli("repro", "--junit", str(pytester.path / "wide"), "--shard", "1/3", "--dry-run")
    assert missing.returncode == 2 and "no shard-1-of-3/junit.xml" in missing.stderr

    url, routes = api
    build = "/organizations/acme/pipelines/tts/builds/9"
    routes[build] = {"number": 9, "jobs": [
        {"id": f"j{k}", "name": "TTS · Wide", "state": "failed", "parallel_group_index": k - 1,
         "parallel_group_total": 2} for k in (1, 2)]}
    for k in (1, 2):
        routes[f"{build}/jobs/j{k}/artifacts"] = [{"path": f"artifacts/wide/shard-{k}-of-2/junit.xml",
                                                  "download_url": f"{url}/dl/{k}"}]
        routes[f"/dl/{k}"] = (pytester.path / f"wide/shard-{k}-of-2/junit.xml").read_bytes()
    env = {"LANEKEEPER_BUILDKITE_API": url, "BUILDKITE_API_TOKEN": TOKEN}
    run = _cli("repro", "--buildkite", "https://buildkite.com/acme/tts/builds/9", "--job", "TTS · Wide",
               "--shard", "2/2", "--dry-run", env=env)
    assert reproduced(run) == failed[2]
    both = _cli("repro", "--buildkite", "https://buildkite.com/acme/tts/builds/9", "--dry-run", env=env)
    assert reproduced(both) == sorted(failed[1] + failed[2])
    none = _cli("repro", "--buildkite", "https://buildkite.com/acme/tts/builds/9", "--shard", "3/4", "--dry-run", env=env)
    assert none.returncode == 2 and "no failed parallel job 3 of 4" in none.stderr


def _build(*results, name="TTS · Wide"):
    return Build(1, "abc", "main", lanes={name: list(results)})


@pytest.mark.parametrize("results,verdict,flaky", [
    ([LaneResult("passed", shard=1), LaneResult("passed", shard=2)], "green", False),
    ([LaneResult("passed", shard=1), LaneResult("failed", 1, shard=2)], "red", False),
    # a shard lost with its agent: infrastructure, not red, when every other shard is green
    ([LaneResult("passed", shard=1), LaneResult("failed", -1, signal_reason="agent_lost", shard=2)], "infra", False),
    # ...and a red shard still makes the lane red
    ([LaneResult("failed", 1, shard=1), LaneResult("failed", -1, signal_reason="agent_lost", shard=2)], "red", False),
    # a lost shard retried green: green
    ([LaneResult("failed", -1, signal_reason="agent_lost", shard=2), LaneResult("passed", shard=1),
      LaneResult("passed", shard=2)], "green", False),
    # one shard failed then passed on a retry: flaky, whatever the other shard did
    ([LaneResult("failed", 1, shard=1), LaneResult("passed", shard=1), LaneResult("failed", 1, shard=2)],
     "red", True),
    # a pass in one shard and a fail in another is not flaky
    ([LaneResult("failed", 1, shard=1), LaneResult("passed", shard=2)], "red", False),
])
def test_a_sharded_lane_is_one_result(sharded, results, verdict, flaky):
    (lane,) = lanes.load(sharded)
    assert _build(*results).verdict(lane) == (verdict, flaky)


def test_history_reads_shards_from_both_ci_systems(api, monkeypatch):
    base, routes = api
    for var, value in (("LANEKEEPER_GITHUB_API", base), ("LANEKEEPER_BUILDKITE_API", base), ("GITHUB_TOKEN", TOKEN),
                       ("BUILDKITE_API_TOKEN", TOKEN)):
        monkeypatch.setenv(var, value)
    ci_api.set_deadline(30)
    routes["/repos/acme/tts/actions/workflows/lanes.yml/runs"] = {"workflow_runs": [
        {"id": 9, "run_number": 5, "head_sha": "abc", "head_branch": "main"}]}
    routes["/repos/acme/tts/actions/runs/9/jobs"] = {"jobs": [
        {"name": "TTS · Wide (shard 1/2)", "conclusion": "success"},
        {"name": "TTS · Wide (shard 2/2)", "conclusion": "failure"}]}
    (build,) = history.from_github("acme/tts", "lanes.yml")
    assert [(r.shard, r.state) for r in build.lanes["TTS · Wide"]] == [(1, "passed"), (2, "failed")]
    routes["/organizations/acme/pipelines/tts/builds"] = [{"number": 7, "commit": "abc", "branch": "main", "jobs": [
        {"type": "script", "name": "TTS · Wide", "state": "passed", "parallel_group_index": 0},
        {"type": "script", "name": "TTS · Wide", "state": "failed", "exit_status": -1, "signal_reason": "agent_lost",
         "parallel_group_index": 1}]}]
    (build,) = history.from_buildkite("acme/tts")
    assert [(r.shard, r.verdict) for r in build.lanes["TTS · Wide"]] == [(1, "green"), (2, "infra")]


def test_history_file_shard_field(tmp_path):
    path = tmp_path / "h.json"
    path.write_text(json.dumps({"builds": [{"number": 1, "commit": "a", "branch": "main",
                                            "lanes": {"wide": [{"state": "passed", "shard": 1},
                                                               {"state": "failed", "shard": 2}]}}]}))
    (build,) = history.load_file(path)
    assert [r.shard for r in build.lanes["wide"]] == [1, 2]
    path.write_text(json.dumps({"builds": [{"number": 1, "commit": "a", "branch": "main",
                                            "lanes": {"wide": {"state": "passed", "shard": 0}}}]}))
    with pytest.raises(history.HistoryError, match=r"\.shard: "):   # names the field, whatever pydantic says
        history.load_file(path)
