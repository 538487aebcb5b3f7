"""Offline matrix, Base (voice cloning from reference audio and its transcript)."""
import dataclasses

import numpy as np
import pytest

from tests.e2e.conftest import make_request

pytestmark = [pytest.mark.offline, pytest.mark.merge_only]


def test_voice_clone(cell, offline_engine, greedy_reference):
    req, codes, audio = greedy_reference["Base"]
    (result,) = offline_engine.generate([dataclasses.replace(req, request_id=f"base-{cell.id}")])
    assert result.ok and len(result.audio) > 0
    np.testing.assert_array_equal(result.codes, codes)
    assert np.abs(result.audio - audio).max() < 1e-3
    assert not np.array_equal(codes, greedy_reference["CustomVoice"][1])


def test_voice_clone_streaming(cell, offline_engine, ref_audio):
    req = make_request("Base", "Cloned and streamed.", ref_audio, seed=3)
    chunks = list(offline_engine.stream(req))
    assert chunks[-1].final and sum(len(c.audio) for c in chunks) > 0
