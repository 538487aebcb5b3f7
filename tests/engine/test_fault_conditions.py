"""A fault that names the setting it needs (`when=KEY:VALUE`) acts only where the profile resolves to it:
a profile can carry a defect that a flip of the default really triggers."""
import pytest

from engine.profile.faults import FaultSpecError, parse
from engine.profile.resolve import ProfileError, resolve
from engine.request import SpeechRequest
from engine.runtime.engine import TTSEngine

V2_DEFECT = "drop_handoff:after_frames=2,when=model_runner:v2"


def test_conditions_parse_typed_and_all_must_hold():
    (fault,) = parse("drop_handoff:after_frames=2,when=model_runner:v2,when=stages.0.enforce_eager:true")
    assert fault.applies({"model_runner": "v2", "stages.0.enforce_eager": True})
    assert not fault.applies({"model_runner": "v2", "stages.0.enforce_eager": False})
    assert not fault.applies({"model_runner": "v1", "stages.0.enforce_eager": True})
    assert parse(str(fault)) == [fault]
    with pytest.raises(FaultSpecError, match="KEY:VALUE"):
        parse("drop_handoff:when=model_runner")


def test_a_condition_on_a_key_the_profile_lacks_is_refused():
    with pytest.raises(ProfileError, match="model_runer") as e:
        resolve("qwen3_tts", platform="cpu", overrides=["faults=drop_handoff:when=model_runer:v2"])
    assert "model_runner" in str(e.value)


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_the_fault_follows_the_runner(runner):
    profile = resolve("qwen3_tts", platform="cpu", overrides=[
        f"model_runner={runner}", f"faults={V2_DEFECT}", "watchdog.handoff_deadline_s=2"])
    with TTSEngine(profile) as engine:
        (result,) = engine.generate([SpeechRequest("A defect of runner v2.", voice="ryan")])
    if runner == "v1":
        assert result.ok and not engine.faults
    else:
        assert not result.ok and result.error.kind == "StageHandoffStall", result.error
