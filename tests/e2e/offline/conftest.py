import numpy as np
import pytest
import torch

from ci.matrix import TEST_WATCHDOG
from engine.config import resolve
from engine.engine import TTSEngine
from engine.models import build_models
from engine.stage0 import Talker
from tests.e2e.conftest import make_request


@pytest.fixture(scope="session")
def offline_engine(cell, platform):
    """One engine per matrix cell, shared by every test of that cell."""
    profile = resolve("qwen3_tts", platform=platform, overrides=cell.overrides + TEST_WATCHDOG)
    with TTSEngine(profile) as engine:
        yield engine


class _Inbox(list):
    put = list.append


def reference_run(request, profile_name="qwen3_tts"):
    """Greedy codes and whole-payload audio for one request, computed in this process.

    Runner v1, eager, one request, and one codec decode over the whole sequence: the
    simplest path through the same models, which every matrix cell must reproduce.
    """
    profile = resolve(profile_name, platform="cpu", overrides=["model_runner=v1", "stages.0.enforce_eager=true"])
    out = _Inbox()
    talker = Talker(profile, _Inbox(), out)
    talker.add(request)
    while talker.busy:
        talker.step()
    (_, _, codes, _, _), = [m for m in out if m[0] == "codes"]
    codec = build_models(parts=("codec",)).codec
    audio = codec(torch.as_tensor(codes)[None])[0].numpy()
    return codes, audio


@pytest.fixture(scope="session")
def greedy_reference(ref_audio):
    refs = {}
    for task in ("CustomVoice", "VoiceDesign", "Base"):
        req = make_request(task, "Greedy codes must match everywhere.", ref_audio, temperature=0.0, seed=7)
        refs[task] = (req, *reference_run(req))
    return refs


def assert_matches_reference(engine, greedy_reference, task: str, request_id: str):
    """The cell's greedy codes equal the reference's; its audio is within 1e-3 of a whole-payload decode."""
    import dataclasses

    req, codes, audio = greedy_reference[task]
    (result,) = engine.generate([dataclasses.replace(req, request_id=request_id)])
    assert result.ok and len(result.audio) > 0, result.error
    np.testing.assert_array_equal(result.codes, codes)
    assert np.abs(result.audio - audio).max() < 1e-3
    return codes
