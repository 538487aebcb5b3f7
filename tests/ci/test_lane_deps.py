"""A lane's files are computed from what its tests import and read, and the pipeline runs a lane when a
change touches one of them; held against what each lane's tests really import (pytest --collect-only)."""
import json
import os
import subprocess
import sys

import pytest

from ci.lanes import buildkite as pipelines
from ci.lanes import deps
from ci.lanes import schema as lanes
from tests.helpers.repo import ROOT

LABELLED_PR = dict(event="pull_request", branch="feature", labels=frozenset({pipelines.MERGE_LABEL}))


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> dict[str, set[str]]:
    """Each lane's files in sys.modules after collecting it, plus what an engine's processes import."""
    tmp = tmp_path_factory.mktemp("imported")
    engine = json.loads(subprocess.run([sys.executable, "-m", "tests.helpers.sysmodules"], cwd=ROOT, check=True,
                                       capture_output=True, text=True, timeout=300).stdout)
    out, seen = {}, {}
    for lane in lanes.load():
        if lane.trigger == "nightly":
            continue
        # lanes that differ only in their -k collect (import) the same modules: collect one of them
        same = (tuple(lane.paths), lane.markers, lane.backend, lane.profile, tuple(sorted(lane.env.items())))
        if same in seen:
            out[lane.key] = out[seen[same]]
            continue
        seen[same] = lane.key
        dump = tmp / f"{lane.key}.json"
        cmd = lane.command(str(tmp / lane.key)) + ["--collect-only", "-q", "-p", "tests.helpers.sysmodules"]
        run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                             env={**os.environ, **lane.env, "LANEKEEPER_SYSMODULES_OUT": str(dump)})
        assert dump.exists(), run.stdout[-2000:] + run.stderr[-2000:]
        files = set(json.loads(dump.read_text()))
        if "engine/runtime/engine.py" in files:   # it starts engines: their processes import more
            files |= set(engine)
        out[lane.key] = files - {"tests/helpers/sysmodules.py"}
    return out


def test_a_change_to_any_module_runs_every_lane_that_imports_it(imported):
    all_lanes = [l for l in lanes.load() if l.key in imported]
    files = deps.lane_files(lanes.load(), ROOT)
    modules = sorted(p.relative_to(ROOT).as_posix() for d in ("engine", "ci") for p in (ROOT / d).rglob("*.py"))
    assert len(modules) > 80
    for module in modules:
        build = pipelines.Build(**LABELLED_PR, changed=(module,))
        for lane in all_lanes:
            decided = pipelines.plan(lane, build, files)
            if module in imported[lane.key]:
                assert decided == "run", f"{module} is imported by lane {lane.key}'s tests, which did not run"
            else:
                assert decided in ("run", "block"), (module, lane.key, decided)
            assert (decided == "run") == (module in files[lane.key]), (module, lane.key)


def test_a_change_under_docs_alone_runs_no_lane():
    files = deps.lane_files(lanes.load(), ROOT)
    build = pipelines.Build(**LABELLED_PR, changed=("docs/model-runner-v2.md",))
    assert {pipelines.plan(l, build, files) for l in lanes.load()} <= {"block", "skip"}


def test_deps_show_the_chain_through_an_import_inside_a_function():
    run = subprocess.run([sys.executable, "-m", "ci.cli", "lanes", "deps", "tts-base"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    chain = lines[lines.index("engine/stage0/vllm_backend.py") + 1]
    assert "inside a function" in chain and chain.strip().startswith(("tests/", "ci/pytest_plugin/"))
    assert "profiles/qwen3_tts.yaml" in lines and "pyproject.toml" in lines


@pytest.mark.parametrize("extra,wrong", [("docs/no-such-file.md", "does not exist"),
                                         ("engine/profile/", "already cover")])
def test_an_extra_must_exist_and_add_something(tmp_path, extra, wrong):
    lane = lanes.find("config").model_copy(update={"source_file_dependencies": [extra]})
    with pytest.raises(lanes.LaneError, match=wrong):
        deps.lane_files([lane], ROOT)


def test_an_extra_runs_the_lane_for_what_no_import_reaches():
    lane = lanes.find("config").model_copy(update={"source_file_dependencies": [".github/"]})
    files = deps.lane_files([lane], ROOT)
    build = pipelines.Build(**LABELLED_PR, changed=(".github/workflows/lanes.yml",))
    assert pipelines.plan(lane, build, files) == "run"
