"""The watchdog names each kind of failure fast, fails only what is affected, and leaves nothing."""
import time

import pytest

from ci.cli import main
from ci.matrix import TEST_WATCHDOG
from engine.profile.resolve import ProfileError, resolve
from engine.runtime.engine import TTSEngine
from engine.errors import StageDied, StageHandoffStall, StageStall
from engine.profile.faults import FaultSpecError, parse
from engine.request import SpeechRequest
from tests.helpers.procs import gone


def _engine(faults, *extra):
    return TTSEngine(resolve("qwen3_tts", platform="cpu", overrides=TEST_WATCHDOG + [f"faults={faults}", *extra]))


def test_kill_stage_1_mid_request_is_stage_died():
    """...and calls the stage by the name its profile gives it."""
    with _engine("kill_stage:stage=1,after_frames=1", "stages.1.name=vocoder") as engine:
        t0 = time.monotonic()
        (result,) = engine.generate([SpeechRequest("Stage one dies while decoding this.")], timeout=30)
        elapsed = time.monotonic() - t0
        pids = engine.pids()
    assert elapsed < 5
    with pytest.raises(StageDied) as err:
        result.raise_for_status()
    d = err.value.diagnosis
    assert d.stage == 1 and d.request_id == result.request_id
    assert d.stage_name == "vocoder" and "stage 1 (vocoder)" in d.message
    assert gone(pids)


def test_stall_stage_0_is_stage_stall():
    with _engine("stall_stage:stage=0,after_steps=3", "watchdog.stage_deadline_s=3") as engine:
        t0 = time.monotonic()
        with pytest.raises(StageStall) as err:
            list(engine.stream(SpeechRequest("Stage zero stops stepping.")))
        assert time.monotonic() - t0 < 8
        pids = engine.pids()
    e = err.value.diagnosis
    # three steps launched, and the frames of all but the last one read back (it stays in flight)
    assert e.stage == 0 and e.frames_produced >= 2 and e.cell == engine.profile.cell
    assert gone(pids)


def test_only_affected_requests_fail():
    """Windows ending past frame 12 are lost: the short request still finishes, the long one stalls."""
    with _engine("drop_handoff:after_frames=12") as engine:
        short, long_ = engine.generate([SpeechRequest("Tiny."), SpeechRequest("A much longer request " * 3)],
                                       timeout=30)
    assert short.ok
    with pytest.raises(StageHandoffStall) as err:
        long_.raise_for_status()
    e = err.value.diagnosis
    assert e.stage == 1 and e.request_ids == (long_.request_id,)
    assert e.frames_handed_off > e.frames_consumed and e.seconds_since_progress >= 5


def test_delay_is_not_a_stall():
    with _engine("delay_handoff:ms=300") as engine:
        (result,) = engine.generate([SpeechRequest("Late but fine.")], timeout=30)
    assert result.ok


@pytest.mark.parametrize("spec,message", [
    ("drop_handoff", None), ("delay_handoff:ms=500", None), ("stall_stage:stage=0,after_steps=5", None),
    ("kill_stage:stage=1,after_requests=1", None), ("kill_stage:stage=0,after_frames=3", None),
    ("explode:now=1", "unknown fault 'explode'"), ("delay_handoff", "delay_handoff needs ms=N"),
    ("delay_handoff:ms=soon", "ms must be an integer"), ("stall_stage:stage=2", "stage must be 0 or 1"),
    ("kill_stage:stage=1", "needs after_requests=N or after_frames=N"), ("drop_handoff:frames=3", "bad parameter"),
])
def test_fault_specs(spec, message):
    if message is None:
        assert str(parse(spec)[0]).startswith(spec.split(":")[0])
    else:
        with pytest.raises(FaultSpecError, match=message):
            parse(spec)


def test_malformed_faults_are_clear_errors(monkeypatch, capsys):
    with pytest.raises(ProfileError, match="faults: .*unknown fault 'boom'"):
        resolve("qwen3_tts", platform="cpu", overrides=["faults=boom:x=1"])
    assert main(["profile", "show", "qwen3_tts", "--set", "faults=delay_handoff:ms=x"]) == 2
    assert "ms must be an integer" in capsys.readouterr().err
    monkeypatch.setenv("LANEKEEPER_FAULTS", "drop_handoff:after=3")
    with pytest.raises(FaultSpecError, match="LANEKEEPER_FAULTS: bad parameter 'after=3'"):
        TTSEngine(resolve("qwen3_tts", platform="cpu"))


def test_dead_stage_is_noticed_with_stall_checks_off():
    with _engine("kill_stage:stage=1,after_frames=1", "watchdog.enabled=false") as engine:
        (result,) = engine.generate([SpeechRequest("Stall checks are off, death is not missed.")], timeout=30)
    with pytest.raises(StageDied):
        result.raise_for_status()
