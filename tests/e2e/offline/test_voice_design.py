"""Offline matrix, VoiceDesign (free-text voice instructions)."""
import numpy as np
import pytest

from tests.helpers.reference import assert_matches_reference, check_as_shipped
from tests.helpers.speech_requests import make_request

pytestmark = [pytest.mark.offline, pytest.mark.merge_only, pytest.mark.task("VoiceDesign")]


def test_voice_design(cell, offline_engine, greedy_reference):
    codes = assert_matches_reference(offline_engine, greedy_reference, "VoiceDesign", f"vd-{cell.id}")
    # the instructions condition the voice: same text and seed as CustomVoice, other codes
    assert not np.array_equal(codes, greedy_reference["CustomVoice"][1])


def test_voice_design_as_shipped(shipped_engine, ref_audio, record_property):
    check_as_shipped(shipped_engine, make_request("VoiceDesign", "Designed by the profile as shipped.", ref_audio,
                                                  seed=3), record_property)
