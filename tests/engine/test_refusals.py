"""Settings that would do nothing, and platforms this machine lacks, are refused with the reason."""
import pytest

from engine.errors import UserError
from engine.profile.errors import ProfileError
from engine.profile.resolve import resolve
from engine.runtime.devices import PlatformUnavailable, usable_platform
from engine.runtime.engine import TTSEngine


def test_a_setting_the_backend_does_not_read_is_refused():
    with pytest.raises(ProfileError) as e:
        resolve("qwen3_tts", platform="cpu", overrides=["stages.0.async_scheduling=false"])
    assert e.value.key == "stages.0.async_scheduling"
    # the backend that reads it takes it, and the default is fine on either
    assert resolve("qwen3_tts", platform="cpu", overrides=["stages.0.async_scheduling=false", "backend=vllm"]) \
        .get("stages.0.async_scheduling") is False
    assert resolve("qwen3_tts", platform="cpu").get("stages.0.async_scheduling") is True


@pytest.mark.parametrize("platform", ["rocm", "musa", "npu", "xpu"])
def test_every_platform_resolves_but_one_without_its_device_does_not_start(platform):
    profile = resolve("qwen3_tts", platform=platform, overrides=["model_runner=v1"])   # resolving never asks
    with pytest.raises(PlatformUnavailable) as e:
        TTSEngine(profile)
    assert isinstance(e.value, UserError) and platform in str(e.value)
    assert usable_platform(platform, cpu_fallback=True) == "cpu"


def test_a_refused_platform_runs_on_the_cpu_when_asked(capsys):
    profile = resolve("qwen3_tts", platform="rocm")
    with TTSEngine(profile, cpu_fallback=True) as engine:
        assert engine.profile.runs_on == "cpu" and engine.profile.platform == "rocm"
    assert "running on the CPU" in capsys.readouterr().out
