"""Offline matrix, CustomVoice: runner x CUDA graphs x handoff, one engine per cell."""
import itertools

import numpy as np
import pytest

from engine.models.presets import CODEBOOK_SIZE, SAMPLE_RATE, SAMPLES_PER_FRAME
from engine.request import SpeechRequest
from engine.models.tokenizer import frames_for_text
from tests.helpers.reference import assert_matches_reference, check_as_shipped
from tests.helpers.speech_requests import TEXTS, make_request

pytestmark = [pytest.mark.offline, pytest.mark.merge_only, pytest.mark.task("CustomVoice")]


def _check_audio(result, text):
    assert result.ok, result.error
    assert result.sample_rate == SAMPLE_RATE
    frames = frames_for_text(text)
    assert result.codes.shape == (frames, 16)
    assert ((result.codes >= 0) & (result.codes < CODEBOOK_SIZE)).all()
    assert result.audio.dtype == np.float32 and result.audio.ndim == 1
    assert len(result.audio) == frames * SAMPLES_PER_FRAME
    assert result.duration_s == pytest.approx(frames * 0.08)
    assert float(np.std(result.audio)) > 0.01, "audio is silent"


def test_text_to_audio(cell, offline_engine):
    (result,) = offline_engine.generate([make_request("CustomVoice", TEXTS[0])])
    _check_audio(result, TEXTS[0])
    assert result.status == "finished_stopped"
    assert {"stage0_s", "stage1_s", "first_audio_s", "total_s"} <= set(result.timings)


def test_streaming_equals_generate(cell, offline_engine):
    text = TEXTS[3]
    chunks = list(offline_engine.stream(make_request("CustomVoice", text, seed=5)))
    assert [c.index for c in chunks] == list(range(len(chunks))) and chunks[-1].final
    frames = frames_for_text(text)
    if cell.handoff == "async_chunk":   # the initial window, then windows of the connector's chunk
        conn = offline_engine.profile.connector()
        first = conn.initial_codec_chunk_frames
        assert len(chunks) == 1 + -(-(frames - first) // conn.codec_chunk_frames)
        assert len(chunks[0].audio) == first * SAMPLES_PER_FRAME
    else:
        assert len(chunks) == 1
    (whole,) = offline_engine.generate([make_request("CustomVoice", text, seed=5)])
    np.testing.assert_array_equal(np.concatenate([c.audio for c in chunks]), whole.audio)


def test_greedy_matches_reference(cell, offline_engine, greedy_reference):
    assert_matches_reference(offline_engine, greedy_reference, "CustomVoice", f"greedy-{cell.id}")


def test_batch_of_32(cell, offline_engine, ref_audio):
    tasks = itertools.cycle(["CustomVoice", "VoiceDesign", "Base", "CustomVoice"])
    lengths = itertools.cycle([2, 9, 20, 5, 30, 1])
    requests = [make_request(next(tasks), f"Request {i}: " + "la " * next(lengths), ref_audio, seed=i)
                for i in range(32)]
    results = offline_engine.generate(requests)
    assert [r.request_id for r in results] == [q.request_id for q in requests]
    for req, res in zip(requests, results):
        _check_audio(res, req.text)


def test_result_independent_of_batch(cell, offline_engine):
    """Sampled (temperature 0.9) codes depend on the request's seed, not on its neighbours."""
    target = lambda: make_request("CustomVoice", TEXTS[1], seed=11)
    (alone,) = offline_engine.generate([target()])
    crowd = offline_engine.generate([make_request("CustomVoice", t, seed=i) for i, t in enumerate(TEXTS)]
                                    + [target()])
    np.testing.assert_array_equal(crowd[-1].codes, alone.codes)
    assert not np.array_equal(crowd[1].codes, alone.codes)   # another seed, another result


def test_bad_request_rejected(cell, offline_engine):
    from engine.request import RequestError

    with pytest.raises(RequestError, match="unknown voice"):
        offline_engine.generate([SpeechRequest("hi", voice="nobody")])
    (ok,) = offline_engine.generate([make_request("CustomVoice", "Still serving.")])
    assert ok.ok


def test_text_to_audio_as_shipped(shipped_engine, record_property):
    result = check_as_shipped(shipped_engine, make_request("CustomVoice", TEXTS[0]), record_property)
    _check_audio(result, TEXTS[0])
