"""Offline matrix, VoiceDesign (free-text voice instructions)."""
import dataclasses

import numpy as np
import pytest

from tests.e2e.conftest import make_request

pytestmark = [pytest.mark.offline, pytest.mark.merge_only]


def test_voice_design(cell, offline_engine, greedy_reference):
    req, codes, audio = greedy_reference["VoiceDesign"]
    (result,) = offline_engine.generate([dataclasses.replace(req, request_id=f"vd-{cell.id}")])
    assert result.ok and len(result.audio) > 0
    np.testing.assert_array_equal(result.codes, codes)
    assert np.abs(result.audio - audio).max() < 1e-3
    # the instructions condition the voice: same text and seed as CustomVoice, other codes
    assert not np.array_equal(codes, greedy_reference["CustomVoice"][1])
