"""Offline matrix, VoiceDesign (free-text voice instructions)."""
import numpy as np
import pytest

from tests.e2e.offline.conftest import assert_matches_reference

pytestmark = [pytest.mark.offline, pytest.mark.merge_only]


def test_voice_design(cell, offline_engine, greedy_reference):
    codes = assert_matches_reference(offline_engine, greedy_reference, "VoiceDesign", f"vd-{cell.id}")
    # the instructions condition the voice: same text and seed as CustomVoice, other codes
    assert not np.array_equal(codes, greedy_reference["CustomVoice"][1])
