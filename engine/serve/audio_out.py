"""Audio as the server sends it: 16-bit PCM, WAV (a streaming header too), FLAC, and a streamed
body that a failure can cut off."""
from __future__ import annotations

import io
import struct

import numpy as np
import soundfile as sf
from fastapi.responses import StreamingResponse

from engine.models.presets import SAMPLE_RATE

MEDIA_TYPES = {"wav": "audio/wav", "pcm": "audio/pcm", "flac": "audio/flac", "mp3": "audio/mpeg",
               "opus": "audio/opus"}


def pcm16(audio: np.ndarray) -> bytes:
    return (np.clip(audio, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()


def wav_header(data_bytes: int = 0xFFFFFFFF - 36) -> bytes:
    """A PCM16 mono WAV header; streaming uses the largest size, as players expect from live WAV."""
    return (b"RIFF" + struct.pack("<I", min(0xFFFFFFFF, 36 + data_bytes)) + b"WAVEfmt "
            + struct.pack("<IHHIIHH", 16, 1, 1, SAMPLE_RATE, SAMPLE_RATE * 2, 2, 16)
            + b"data" + struct.pack("<I", data_bytes))


def encode(audio: np.ndarray, fmt: str) -> bytes:
    """Every format carries the same 16-bit samples as the stream would."""
    pcm = pcm16(audio)
    if fmt == "pcm":
        return pcm
    buf = io.BytesIO()
    sf.write(buf, np.frombuffer(pcm, dtype="<i2"), SAMPLE_RATE, format=fmt.upper(), subtype="PCM_16")
    return buf.getvalue()


class StreamCut(Exception):
    """Raised by a raw audio body to end the transfer without its last chunk."""


class AudioStream(StreamingResponse):
    """A streamed body that can be cut off, and that always runs `on_close`, even if it never started.

    HTTP has no way to fail a response whose headers are sent, except not finishing it: without
    the final chunk uvicorn closes the connection and every client reports an incomplete read.
    """

    def __init__(self, content, on_close, **kw):
        super().__init__(content, **kw)
        self.on_close = on_close

    async def stream_response(self, send) -> None:
        try:
            await super().stream_response(send)
        except StreamCut:
            pass

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()
