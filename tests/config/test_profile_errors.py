"""Bad profiles and bad overrides: exit 2 and one message naming file, key path and line."""
import pytest

from ci.cli import main

pytestmark = pytest.mark.config

GOOD_STAGES = """\
stages:
  - stage_id: 0
    max_num_seqs: 4
  - stage_id: 1
    devices: "0"
"""

CASES = {
    "syntax": ("model_runner: v1\nstages: [\n  - stage_id: 0\n", None, "YAML syntax error", 3),
    "unknown_key": (GOOD_STAGES + "frobnicate: 3\n", "frobnicate", "unknown key", 6),
    "unknown_stage_key": (GOOD_STAGES.replace("    max_num_seqs: 4\n  - stage_id: 1",
                                              "    max_num_seqz: 4\n  - stage_id: 1"),
                          "stages.0.max_num_seqz", "unknown key", 3),
    "wrong_type": (GOOD_STAGES.replace("max_num_seqs: 4\n  - stage_id: 1", "max_num_seqs: lots\n  - stage_id: 1"),
                   "stages.0.max_num_seqs", "valid integer", 3),
    "bad_runner": ("model_runner: v3\n" + GOOD_STAGES, "model_runner", "'v1' or 'v2'", 1),
    "duplicate_stage": (GOOD_STAGES + "  - stage_id: 1\n", "stages[2]", "duplicate stage_id 1", 6),
    "code2wav_knob": (GOOD_STAGES.replace('devices: "0"', "max_num_seqs: 4"), "stages.1.max_num_seqs", "unknown key", 5),
    "no_stage_id": (GOOD_STAGES + "  - max_num_seqs: 2\n", "stages", "needs an integer stage_id", 6),
    "unknown_stage": (GOOD_STAGES.replace("stage_id: 1", "stage_id: 2"), "stages.2", "expected tags: 0, 1", 4),
    "duplicate_key": ("async_chunk: true\nasync_chunk: false\n" + GOOD_STAGES, None, "duplicate", 2),
    "bad_platform": (GOOD_STAGES + "platforms:\n  tpu: {}\n", "platforms.tpu", "", 7),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_profile(case, tmp_path, capsys):
    text, key, message, line = CASES[case]
    path = tmp_path / f"{case}.yaml"
    path.write_text(text)
    assert main(["profile", "show", str(path), "--platform", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"{path}:{line}" in err, err
    if key:
        assert f": {key}:" in err, err
    assert message in err, err
    assert main(["profile", "check", str(path)]) == 2


def test_base_config_cycle(tmp_path, capsys):
    (tmp_path / "a.yaml").write_text("base_config: b.yaml\n" + GOOD_STAGES)
    (tmp_path / "b.yaml").write_text("# b\nbase_config: a.yaml\n")
    assert main(["profile", "show", str(tmp_path / "a.yaml")]) == 2
    err = capsys.readouterr().err
    assert "base_config cycle: a.yaml -> b.yaml -> a.yaml" in err and "b.yaml:2: base_config" in err


def test_base_config_missing(tmp_path, capsys):
    (tmp_path / "a.yaml").write_text(GOOD_STAGES + "base_config: nowhere.yaml\n")
    assert main(["profile", "show", str(tmp_path / "a.yaml")]) == 2
    err = capsys.readouterr().err
    assert "a.yaml:6: base_config: base_config file not found" in err and "nowhere.yaml" in err


def test_missing_profile(capsys):
    assert main(["profile", "show", "no_such_profile"]) == 2
    assert "no such profile file" in capsys.readouterr().err


@pytest.mark.parametrize("override,message", [
    ("model_runner", "expected KEY=VALUE"),
    ("=v1", "expected KEY=VALUE"),
    ("stages..x=1", "empty part"),
    ("stages.talker.max_num_seqs=1", "stages.<stage_id>.<key>"),
    ("stages.0.max_num_seqs=many", "stages.0.max_num_seqs: "),
    ("stages.0.nope=1", "stages.0.nope: unknown key"),
    ("stages.7.max_num_seqs=1", "no stage 7"),
    ("model_runner=v9", "model_runner: "),
    ("platforms.cpu.model_runner=v1", "cannot be overridden"),
    ("watchdog.stages.x=1", "watchdog.stages: unknown key"),
    ("stages.1.max_num_seqs=4", "stages.1.max_num_seqs: unknown key"),   # code2wav has no batch to size
])
def test_malformed_set(override, message, capsys):
    assert main(["profile", "show", "qwen3_tts", "--platform", "cpu", "--set", override]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_bad_cli_argument(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["profile", "show", "qwen3_tts", "--platform", "tpu"])
    assert exc.value.code == 2
    assert "invalid choice: 'tpu'" in capsys.readouterr().err


def test_a_bad_value_is_named_with_its_key(capsys):
    """Whatever the schema library says about it, the error names the key and the value given."""
    assert main(["profile", "show", "qwen3_tts", "--platform", "cpu", "--set", "stages.0.max_num_seqs=many"]) == 2
    err = capsys.readouterr().err
    assert "stages.0.max_num_seqs: " in err and "'many'" in err
