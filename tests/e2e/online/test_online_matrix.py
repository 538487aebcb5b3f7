"""Online matrix through the official openai client: every format, streamed and not, per cell."""
import base64
import json

import numpy as np
import pytest

from engine.models.tokenizer import frames_for_text
from tests.helpers.online import data_url, decode

pytestmark = [pytest.mark.online, pytest.mark.merge_only]

TEXT = "Online speech, streamed or whole."


def _speech(client, fmt, **extra):
    return client.audio.speech.create(model="qwen3-tts", input=TEXT, voice="ryan", response_format=fmt,
                                      extra_body={"seed": 3, **extra}).content


def _stream(client, fmt, stream_format="audio", **extra):
    """A raw audio stream (`stream: true`), or SSE events as the official client asks for them: its own
    `stream_format="sse"` parameter, and nothing else."""
    if stream_format == "audio":
        with client.audio.speech.with_streaming_response.create(
                model="qwen3-tts", input=TEXT, voice="ryan", response_format=fmt,
                extra_body={"seed": 3, "stream": True, **extra}) as resp:
            assert resp.status_code == 200
            return b"".join(resp.iter_bytes())
    with client.audio.speech.with_streaming_response.create(
            model="qwen3-tts", input=TEXT, voice="ryan", response_format=fmt, stream_format="sse",
            extra_body={"seed": 3, **extra}) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[len("data: "):]) for line in resp.iter_lines() if line.startswith("data: ")]
    assert [e["type"] for e in events][-1] == "speech.audio.done"
    assert all(e["type"] == "speech.audio.delta" for e in events[:-1])
    assert events[-1]["usage"]["output_tokens"] == frames_for_text(TEXT)
    return b"".join(base64.b64decode(e["audio"]) for e in events[:-1])


@pytest.mark.task("CustomVoice")
def test_text_to_audio(cell, client):
    expected = frames_for_text(TEXT) * 1920
    decoded = {}
    for fmt in ("wav", "pcm", "flac"):
        decoded[fmt] = decode(_speech(client, fmt), fmt)
    decoded["stream-pcm"] = decode(_stream(client, "pcm"), "pcm")
    decoded["stream-wav"] = decode(_stream(client, "wav"), "wav")
    decoded["sse-pcm"] = decode(_stream(client, "pcm", "sse"), "pcm")
    for name, (audio, sr) in decoded.items():
        assert sr == 24000, name
        assert len(audio) == expected, name
        np.testing.assert_array_equal(audio, decoded["wav"][0], err_msg=name)
    assert np.std(decoded["wav"][0]) > 100


@pytest.mark.task("VoiceDesign")
def test_voice_design(cell, client):
    audio = _speech(client, "wav", task_type="VoiceDesign", instructions="A bright, fast, cheerful voice.")
    design, sr = decode(audio, "wav")
    plain, _ = decode(_speech(client, "wav"), "wav")
    assert sr == 24000 and len(design) == len(plain) and not np.array_equal(design, plain)


@pytest.mark.task("Base")
def test_voice_clone(cell, client):
    ref = (0.2 * np.sin(np.arange(24000) / 7)).astype(np.float32)
    extra = {"task_type": "Base", "ref_audio": data_url(ref), "ref_text": "A reference line."}
    whole, sr = decode(_speech(client, "wav", **extra), "wav")
    streamed, _ = decode(_stream(client, "pcm", **extra), "pcm")
    assert sr == 24000 and len(whole) == frames_for_text(TEXT) * 1920
    np.testing.assert_array_equal(streamed, whole)
