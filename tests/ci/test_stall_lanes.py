"""The plugin end to end: a faulted matrix turns red fast with every cell named, a blocked test is
ended by its timeout with stacks in the report, and the lane budget ends a run cleanly."""
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from ci.matrix import cells

ROOT = Path(__file__).resolve().parents[2]


def _tagged(tag: str, wait: float = 5.0) -> list[psutil.Process]:
    """Processes (other than this one) still running whose environment carries this run's tag."""
    deadline = time.monotonic() + wait
    while True:
        left = []
        for proc in psutil.process_iter():
            try:
                if proc.pid != os.getpid() and proc.environ().get("LANEKEEPER_TEST_TAG") == tag \
                        and proc.status() != psutil.STATUS_ZOMBIE:
                    left.append(proc)
            except (psutil.Error, OSError):
                continue
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


# Shorter than the matrix's own deadline: each of the eight cells waits it out once (the run's own setting,
# --lk-set, reaching every engine and server of the matrix)
HANDOFF_DEADLINE_S = 2
# Under pytest-xdist the faulted matrix runs this runner's cells: the serial run has shown every cell
XDIST_RUNNER = "v2"


def _faulted_run(tmp_path, path, *extra):
    tag = uuid.uuid4().hex
    env = {**os.environ, "LANEKEEPER_FAULTS": "drop_handoff:after_frames=2", "LANEKEEPER_TEST_TAG": tag}
    t0 = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "pytest", path, "-m", "merge_only", "-q", "-p", "no:cacheprovider",
                          "--lk-set", f"watchdog.handoff_deadline_s={HANDOFF_DEADLINE_S}",
                          "--lk-report-dir", str(tmp_path), "--junitxml", str(tmp_path / "junit.xml"), *extra],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    return run, time.monotonic() - t0, tag


@pytest.mark.slow
@pytest.mark.parametrize("mode,workers", [("offline", None), ("online", None), ("offline", "2")])
def test_faulted_matrix_is_red_fast_and_names_every_cell(mode, workers, tmp_path):
    """...serially, and under pytest-xdist, where the incidents happen in the workers and the report is the
    controller's (there one runner's four cells)."""
    extra = ["-n", workers, "-k", XDIST_RUNNER] if workers else []
    run, wall, tag = _faulted_run(tmp_path, f"tests/e2e/{mode}", *extra)
    assert run.returncode == 1, run.stdout[-3000:]
    if mode == "offline":
        assert wall < 120, wall
    summary = (tmp_path / "matrix-summary.md").read_text()
    incidents = json.loads((tmp_path / "stall-report.json").read_text())
    assert (tmp_path / "stall-report.md").exists() and (tmp_path / "junit.xml").exists()
    by_cell = {i["cell"]: i for i in incidents}
    ran = [cell for cell in cells() if not workers or cell.runner == XDIST_RUNNER]
    for cell in ran:
        assert cell.id in summary.split("Stalled cells:")[1], cell.id
        inc = by_cell[cell.id]
        d = inc["diagnosis"]
        assert d["kind"] == "StageHandoffStall" and d["stage"] == 1, inc
        assert inc["seconds"] < 10, inc
        assert HANDOFF_DEADLINE_S <= d["seconds_since_progress"] < HANDOFF_DEADLINE_S + 2, inc   # not 5 s
        assert d["request_id"] and d["request_id"] in d["message"]
        assert d["cell"] == cell.id
        assert inc["stacks"], "no stacks were dumped"
        assert any(k.startswith("stage 1 (code2wav), pid") for k in inc["stacks"]), list(inc["stacks"])
    assert "Stalled cells:" in run.stdout
    assert not _tagged(tag)
    # the report made from the JUnit file tells the same story as the summary the run wrote
    report = subprocess.run([sys.executable, "-m", "ci.cli", "report", "--junit", str(tmp_path / "junit.xml")],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert report.stdout.split("\n\n", 3)[:3] == summary.split("\n\n", 3)[:3]
    assert "StageHandoffStall: stage 1 (code2wav)" in summary.split("Failed tests:")[1]


def test_blocked_test_is_ended_by_timeout_with_stacks(pytester, tmp_path):
    pytester.makepyfile(test_blocks="""
        import threading
        import pytest
        from engine.profile.resolve import resolve
        from engine.runtime.engine import TTSEngine

        @pytest.fixture(scope="module")
        def engine():
            with TTSEngine(resolve("qwen3_tts", platform="cpu")) as e:
                yield e

        @pytest.mark.timeout(4, func_only=True)   # the engine's start (setup) is not what is timed
        def test_blocks_forever(engine):
            threading.Event().wait()

        def test_runs_after(engine):
            pass
    """)
    tag = uuid.uuid4().hex
    os.environ["LANEKEEPER_TEST_TAG"] = tag
    try:
        t0 = time.monotonic()
        result = pytester.runpytest_subprocess("--timeout", "120", "--lk-report-dir",
                                               str(tmp_path), "--junitxml", str(tmp_path / "junit.xml"))
    finally:
        del os.environ["LANEKEEPER_TEST_TAG"]
    assert time.monotonic() - t0 < 60
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed") == 1 and outcomes.get("passed", 0) + outcomes.get("errors", 0) >= 1
    (incident,) = json.loads((tmp_path / "stall-report.json").read_text())
    assert incident["diagnosis"]["kind"] == "Timeout" and incident["test"].endswith("test_blocks_forever")
    stacks = "\n".join(incident["stacks"].values())
    assert "stage/loop.py" in stacks and "most recent call first" in stacks
    assert "testcase" in (tmp_path / "junit.xml").read_text()
    assert not _tagged(tag)


def test_lane_budget_stops_the_run(pytester):
    pytester.makepyfile(test_slow="""
        import time
        import pytest

        @pytest.mark.parametrize("i", range(5))
        def test_slow(i):
            time.sleep(1.0)
    """)
    result = pytester.runpytest_subprocess("--session-timeout", "2.5")
    outcomes = result.parseoutcomes()
    # the run stopped early, and is red (the last test it started may have been cut off at the budget)
    assert result.ret == 1 and outcomes.get("passed", 0) + outcomes.get("failed", 0) < 5


def test_the_budget_caps_a_test_with_its_own_timeout(pytester):
    """A test's own, longer timeout marker does not let it run past the lane budget."""
    pytester.makepyfile(test_long="""
        import time
        import pytest

        @pytest.mark.timeout(60)
        def test_long():
            time.sleep(30)
    """)
    t0 = time.monotonic()
    result = pytester.runpytest_subprocess("--session-timeout", "3", "--lk-report-dir", "reports")
    assert time.monotonic() - t0 < 20, result.stdout.str()[-2000:]
    assert result.ret == 1
    (incident,) = json.loads((pytester.path / "reports" / "stall-report.json").read_text())
    assert incident["diagnosis"]["kind"] == "Timeout" and incident["seconds"] < 10


def test_one_diagnosis_everywhere(pytester, tmp_path):
    """One injected stall's diagnosis, followed from the API error body the client got through the JUnit
    record, the stall report and `lanekeeper report`: the same fields, read back through one model."""
    pytester.makepyfile(test_api_stall=f"""
        import json
        import pytest
        from openai import OpenAI
        from engine.serve.launcher import RemoteServer

        def test_stalls():
            args = ["--platform", "cpu", "--set", "watchdog.handoff_deadline_s=2"]
            with RemoteServer(args, env={{"LANEKEEPER_FAULTS": "drop_handoff:after_frames=2"}}) as srv:
                client = OpenAI(base_url=srv.url + "/v1", api_key="EMPTY", max_retries=0, timeout=120)
                try:
                    client.audio.speech.create(model="qwen3-tts", voice="vivian", input="Hello there.")
                except Exception as e:
                    with open({str(tmp_path / "api.json")!r}, "w") as f:
                        json.dump(e.body, f)
                    raise
    """)
    result = pytester.runpytest_subprocess("--lk-report-dir", str(tmp_path),
                                           "--junitxml", str(tmp_path / "junit.xml"))
    assert result.ret == 1, result.stdout.str()[-3000:]
    from ci.run.junit import parse
    from engine.diagnosis import Diagnosis

    api = json.loads((tmp_path / "api.json").read_text())
    assert api["code"] == "StageHandoffStall" and "StageHandoffStall: stage 1" in api["message"]
    seen = {"API error body": Diagnosis.model_validate(api["diagnosis"])}
    (case,) = parse(tmp_path / "junit.xml")
    seen["JUnit"] = case.diagnosis
    (incident,) = json.loads((tmp_path / "stall-report.json").read_text())
    seen["stall report"] = Diagnosis.model_validate(incident["diagnosis"]).model_copy(update={"traceback": None})
    report = subprocess.run([sys.executable, "-m", "ci.cli", "report", "--junit", str(tmp_path / "junit.xml"),
                             "--format", "json"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    (failure,) = json.loads(report.stdout)["failures"]
    seen["lanekeeper report"] = Diagnosis.model_validate(failure["diagnosis"])
    first = seen["API error body"]
    assert first.kind == "StageHandoffStall" and first.stage == 1 and first.stage_name == "code2wav"
    assert first.request_id and first.cell and first.frames_handed_off > first.frames_consumed
    for where, diagnosis in seen.items():
        assert diagnosis == first, where
    # ...and people read it in words, not as a dict
    assert failure["status"] == "stalled" and failure["why"] == first.message
    md = (tmp_path / "stall-report.md").read_text()
    assert first.message in md and "{" not in md.split("<details>")[0]


def test_an_error_body_that_is_not_ours_carries_no_diagnosis():
    """The plugin reads a diagnosis out of an API error through the model; a body it cannot read is no
    diagnosis, not a crash of the report."""
    from ci.pytest_plugin.stalls import diagnoses_in
    from engine.diagnosis import Diagnosis

    ours = Diagnosis(kind="StageStall", message="StageStall: stage 0 (talker) made no step for 10.1s", stage=0)

    class Ours(Exception):
        body = {"error": {"code": "StageStall", "diagnosis": ours.public()}}

    class Foreign(Exception):
        body = {"error": {"code": "StageStall", "diagnosis": {"kind": "StageStall", "stage": "zero"}}}

    assert diagnoses_in(Ours()) == [ours]
    assert diagnoses_in(Foreign()) == []
