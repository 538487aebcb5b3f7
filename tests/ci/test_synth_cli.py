"""`lanekeeper synth`: flags reach the engine, the WAV is right, bad input exits 2."""
import subprocess

import numpy as np
import pytest
import soundfile as sf

from ci.cli import main
from engine.models.tokenizer import frames_for_text

TEXT = "Hello from the talker."


def _read(path):
    audio, sr = sf.read(path)
    return audio, sr


def test_console_script_writes_wav(tmp_path):
    out = tmp_path / "out.wav"
    run = subprocess.run(["lanekeeper", "synth", TEXT, "-o", str(out)], capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr
    audio, sr = _read(out)
    info = sf.info(out)
    assert sr == 24000 and info.channels == 1
    assert len(audio) == frames_for_text(TEXT) * 1920
    assert info.duration == pytest.approx(frames_for_text(TEXT) * 0.08)
    assert np.std(audio) > 0.01


@pytest.mark.parametrize("flags", [
    ["--runner", "v1", "--cuda-graph", "off", "--handoff", "full_payload", "--task", "CustomVoice", "--voice", "eric"],
    ["--runner", "v2", "--cuda-graph", "on", "--handoff", "async_chunk", "--task", "VoiceDesign",
     "--instructions", "An old sea captain.", "--temperature", "0", "--seed", "4", "--language", "english"],
    ["--profile", "qwen3_tts_high_concurrency", "--platform", "cpu", "--preset", "tiny",
     "--set", "stages.0.max_num_seqs=2", "--task", "Base", "--ref-text", "The reference."],
], ids=["v1-eager-full", "v2-graphs-async-design", "profile-set-base"])
def test_flag_combinations(flags, tmp_path, capsys):
    out = tmp_path / "o.wav"
    if "Base" in flags:
        ref = tmp_path / "ref.flac"
        sf.write(ref, np.sin(np.arange(12000) / 10).astype(np.float32) * 0.2, 16000)
        flags = flags + ["--ref-audio", str(ref)]
    assert main(["synth", TEXT, "-o", str(out), *flags]) == 0
    audio, sr = _read(out)
    assert sr == 24000 and len(audio) == frames_for_text(TEXT) * 1920
    said = capsys.readouterr().out
    if "v1" in flags:
        assert "(v1, eager, full_payload" in said
    if "--cuda-graph" in flags and "on" in flags:
        assert "(v2, cuda graphs, async_chunk" in said


@pytest.mark.parametrize("flags,message", [
    (["--runner", "v3"], "invalid choice: 'v3'"),
    (["--cuda-graph", "maybe"], "invalid choice: 'maybe'"),
    (["--seed", "abc"], "invalid int value"),
    (["--task", "Base", "--ref-text", "x"], "Base needs ref_audio"),
    (["--task", "Base", "--ref-audio", "/nonexistent.wav", "--ref-text", "x"], "--ref-audio /nonexistent.wav: no such file"),
    (["--voice", "nobody"], "unknown voice 'nobody'"),
    (["--task", "VoiceDesign"], "VoiceDesign needs instructions"),
    (["--set", "stages.0.max_num_seqs=zero"], "valid integer"),
    (["--platform", "npu", "--runner", "v2"], "v2 is not implemented on npu"),
])
def test_bad_flags_exit_2(flags, message, tmp_path, capsys):
    try:
        code = main(["synth", "Hi.", "-o", str(tmp_path / "x.wav"), *flags])
    except SystemExit as e:
        code = e.code
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x.wav").exists()


def test_bad_reference_audio_file(tmp_path, capsys):
    bad = tmp_path / "ref.wav"
    bad.write_bytes(b"RIFF....WAVEfmt garbage")
    assert main(["synth", "Hi.", "-o", str(tmp_path / "x.wav"), "--task", "Base", "--ref-audio", str(bad),
                 "--ref-text", "x"]) == 2
    assert f"--ref-audio {bad}: not a readable audio file" in capsys.readouterr().err
