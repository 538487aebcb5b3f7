"""Every shipped profile validates, every pin holds, and precedence runs in its one order: overrides, the
platform section, the overlay, the base, schema defaults."""
import glob
import json
import subprocess
import sys

import pytest

from engine.profile import pins
from engine.profile.resolve import GPU_NODES, ProfileError, check_file, resolve
from tests.helpers.repo import PROFILES_DIR
from engine.profile.schema import PLATFORMS
from engine.profile.document import ProfileDoc

pytestmark = pytest.mark.config

_, PINS = pins.read(PROFILES_DIR)
PROFILES = pins.profile_names(PROFILES_DIR)


def test_every_profile_is_pinned():
    assert sorted(PINS) == PROFILES


@pytest.mark.parametrize("name", PROFILES)
def test_profile_validates(name):
    assert check_file(name) == []


@pytest.mark.parametrize("name", PROFILES)
def test_pins_hold(name):
    """The pins are what the profile resolves to, on every platform (regenerate: lanekeeper profile pin)."""
    fresh = pins.compute(PROFILES_DIR, [name])[name]
    wrong = {f"{platform} {key}": (PINS[name].get(platform, {}).get(key, "<absent>"), value)
             for platform in PLATFORMS for key, value in fresh[platform].items()
             if PINS[name].get(platform, {}).get(key, "<absent>") != value}
    assert not wrong, f"{name}: (pinned, resolved): {wrong}"


def test_pins_file_is_generated():
    assert pins.drift(PROFILES_DIR) == []


def test_pins_cover_every_platform():
    for name, platforms in PINS.items():
        assert sorted(platforms) == sorted(PLATFORMS), name


@pytest.mark.parametrize("platform", PLATFORMS)
def test_opt_in_profiles_stay_opt_in(platform):
    control = resolve("qwen3_tts_high_concurrency", platform=platform)
    assert control.config.model_runner == "v1"
    if platform in ("cuda", "cpu"):
        assert resolve("qwen3_tts_high_concurrency_mrv2", platform=platform).config.model_runner == "v2"
        assert resolve("qwen3_tts_mrv2", platform=platform).config.model_runner == "v2"


def test_default_profile_runner_per_platform():
    """The default's runner is what pins.yaml says (the one place for it); v2-less platforms always pin v1."""
    runners = {p: resolve("qwen3_tts", platform=p).config.model_runner for p in PLATFORMS}
    assert runners == {p: PINS["qwen3_tts"][p]["model_runner"] for p in PLATFORMS}
    assert {runners[p] for p in ("rocm", "npu", "xpu", "musa")} == {"v1"}
    for p in ("rocm", "npu", "xpu", "musa"):
        assert "[platforms." in resolve("qwen3_tts", platform=p).sources["model_runner"]


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_precedence(tmp_path):
    """overrides > platform section > overlay > base > schema default."""
    _write(tmp_path, "base.yaml", """\
model_runner: v1
async_chunk: true
connectors: {shm: {codec_chunk_frames: 10}}
stages:
  - {stage_id: 0, max_num_seqs: 4, output_connector: shm}
  - {stage_id: 1, devices: "1", input_connector: shm}
platforms:
  rocm:
    stages:
      - {stage_id: 0, max_num_seqs: 7}
""")
    overlay = _write(tmp_path, "overlay.yaml", """\
base_config: base.yaml
model_runner: v2
stages:
  - {stage_id: 0, max_num_seqs: 5}
platforms:
  rocm:
    model_runner: v1
""")
    cpu = resolve(overlay, platform="cpu")
    assert cpu.config.model_runner == "v2" and cpu.sources["model_runner"].endswith("overlay.yaml:2")
    assert cpu.get("stages.0.max_num_seqs") == 5
    assert cpu.get("stages.1.devices") == "1" and "base.yaml:6" in cpu.sources["stages.1.devices"]
    assert cpu.get("stages.0.max_model_len") == 4096 and "stages.0.max_model_len" not in cpu.sources
    rocm = resolve(overlay, platform="rocm")
    assert rocm.config.model_runner == "v1" and "[platforms.rocm]" in rocm.sources["model_runner"]
    assert rocm.get("stages.0.max_num_seqs") == 7  # base's platform section beats the overlay's stage value
    forced = resolve(overlay, platform="rocm", overrides=["stages.0.max_num_seqs=9", "model_runner=v2"])
    assert forced.get("stages.0.max_num_seqs") == 9 and forced.config.model_runner == "v2"
    assert forced.sources["model_runner"] == "override --set model_runner=v2"
    assert forced.explain()["stages.0.max_model_len"]["source"] == "schema default"


def test_v2_refused_on_npu_and_xpu():
    for platform in ("npu", "xpu"):
        with pytest.raises(ProfileError, match=f"v2 is not implemented on {platform}"):
            resolve("qwen3_tts", platform=platform, overrides=["model_runner=v2"])


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "ci.cli", *args], capture_output=True, text=True)


def test_cli_show_json_and_explain():
    out = _cli("profile", "show", "qwen3_tts", "--platform", "cuda", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["model_runner"] == PINS["qwen3_tts"]["cuda"]["model_runner"]
    out = _cli("profile", "show", "qwen3_tts", "--platform", "rocm", "--json", "--explain")
    explained = json.loads(out.stdout)
    doc = ProfileDoc.load(PROFILES_DIR / "qwen3_tts.yaml")
    assert explained["model_runner"]["value"] == "v1"
    assert explained["model_runner"]["source"].endswith(
        f"qwen3_tts.yaml:{doc.line('platforms.rocm.model_runner')} [platforms.rocm]")
    assert explained["stages.0.max_num_batched_tokens"]["source"].endswith(
        f"qwen3_tts.yaml:{doc.line('stages.0.max_num_batched_tokens')}")


@pytest.mark.skipif(any(glob.glob(node) for node in GPU_NODES), reason="a GPU device node is here: torch is asked")
def test_the_platform_of_a_machine_with_no_gpu_is_known_without_torch():
    """Every lane's pytest run and every engine client resolves its profile for the platform it is on; with no
    GPU device node that takes no torch import (3 CPU-s, and more at exit)."""
    code = ("import sys; from engine.profile.resolve import detect_platform, resolve; "
            "print(detect_platform(), resolve('qwen3_tts').platform, 'torch' in sys.modules)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.split() == ["cpu", "cpu", "False"]
