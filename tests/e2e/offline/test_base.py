"""Offline matrix, Base (voice cloning from reference audio and its transcript)."""
import numpy as np
import pytest

from tests.helpers.reference import assert_matches_reference, check_as_shipped
from tests.helpers.speech_requests import make_request

pytestmark = [pytest.mark.offline, pytest.mark.merge_only, pytest.mark.task("Base")]


def test_voice_clone(cell, offline_engine, greedy_reference):
    codes = assert_matches_reference(offline_engine, greedy_reference, "Base", f"base-{cell.id}")
    assert not np.array_equal(codes, greedy_reference["CustomVoice"][1])


def test_voice_clone_streaming(cell, offline_engine, ref_audio):
    req = make_request("Base", "Cloned and streamed.", ref_audio, seed=3)
    chunks = list(offline_engine.stream(req))
    assert chunks[-1].final and sum(len(c.audio) for c in chunks) > 0


def test_voice_clone_as_shipped(shipped_engine, ref_audio, record_property):
    check_as_shipped(shipped_engine, make_request("Base", "Cloned by the profile as shipped.", ref_audio, seed=3),
                     record_property)
