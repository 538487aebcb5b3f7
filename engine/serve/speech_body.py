"""What a client sends to `/v1/audio/speech`: the body, read with a size cap, parsed and checked
into an engine `SpeechRequest`, or refused with a 4xx that names the field."""
from __future__ import annotations

import base64
import binascii
import io
import json
from pathlib import Path
from typing import Literal

import numpy as np
import soundfile as sf
from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engine.serve.api_errors import APIError
from engine.models.presets import SAMPLE_RATE
from engine.request import (MAX_INPUT_CHARS, MAX_NEW_TOKENS, MAX_SEED, MAX_TEMPERATURE, RequestError,
                            SpeechRequest)

MODEL_ID = "qwen3-tts"
STREAMABLE = ("wav", "pcm")
MAX_REF_AUDIO_BYTES = 20 * 1024 * 1024
MAX_BODY_BYTES = 32 * 1024 * 1024   # a base64 ref_audio at its cap, plus the rest of the body


class SpeechBody(BaseModel):
    # The bounds are the engine's own (engine/request.py), so that a request the engine cannot honour is a
    # 400 here, naming the field, and never reaches a stage.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    input: str
    model: str = MODEL_ID
    voice: str | None = "vivian"
    response_format: Literal["wav", "pcm", "flac", "mp3", "opus"] = "wav"
    speed: float = Field(1.0, ge=0.25, le=4.0)
    stream: bool = False
    stream_format: Literal["audio", "sse"] = "audio"
    task_type: Literal["CustomVoice", "VoiceDesign", "Base"] = "CustomVoice"
    language: str = "auto"
    instructions: str | None = Field(None, max_length=MAX_INPUT_CHARS)
    ref_audio: str | None = None
    ref_text: str | None = Field(None, max_length=MAX_INPUT_CHARS)
    max_new_tokens: int | None = Field(None, ge=1, le=MAX_NEW_TOKENS)
    seed: int = Field(0, ge=0, le=MAX_SEED)
    temperature: float | None = Field(None, ge=0, le=MAX_TEMPERATURE)

    @property
    def streams(self) -> bool:
        """Streamed: `stream: true`, or `stream_format: "sse"` alone, which is what the OpenAI API (and
        its official client's `stream_format="sse"`) sends for a stream of events."""
        return self.stream or self.stream_format == "sse"


def parse_body(raw: bytes) -> "SpeechBody":
    """The request body as a SpeechBody, or a 400 that says what is wrong with it and where."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise APIError(400, f"request body is not UTF-8: byte 0x{raw[e.start]:02x} at offset {e.start}",
                       code="invalid_json") from None
    try:
        data = json.loads(text)
    except RecursionError:
        raise APIError(400, "request body nests too deeply to parse", code="invalid_json") from None
    except ValueError as e:
        raise APIError(400, f"request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise APIError(400, f"request body must be a JSON object, not {type(data).__name__}", code="invalid_json")
    try:
        return SpeechBody.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        param = ".".join(str(p) for p in err.get("loc", ())) or None
        unknown = err.get("type") == "extra_forbidden"
        msg = "unknown field" if unknown else err.get("msg", "invalid request")
        raise APIError(400, f"{param}: {msg}" if param else msg, param,
                       "unknown_field" if unknown else "invalid_value") from None
    except RecursionError:
        raise APIError(400, "request body nests too deeply to validate", code="invalid_json") from None


async def read_body(request: Request) -> bytes:
    """The body, refused with 413 as soon as it passes MAX_BODY_BYTES (never buffered whole)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise APIError(413, f"request body is {int(declared)} bytes; at most {MAX_BODY_BYTES}", code="body_too_large")
    parts, size = [], 0
    async for part in request.stream():
        size += len(part)
        if size > MAX_BODY_BYTES:
            raise APIError(413, f"request body is over {MAX_BODY_BYTES} bytes", code="body_too_large")
        parts.append(part)
    return b"".join(parts)


class ReferenceLoader:
    """`ref_audio` as a data URL, or a file:// path inside --allowed-local-media-path."""

    def __init__(self, allowed_dir: str | None):
        self.allowed = Path(allowed_dir).resolve() if allowed_dir else None

    def load(self, ref: str) -> tuple[np.ndarray, int]:
        if ref.startswith("data:"):
            header, sep, payload = ref.partition(",")
            if not sep or ";base64" not in header:
                raise APIError(400, "ref_audio data URL must look like data:audio/wav;base64,<data>", "ref_audio")
            try:
                raw = base64.b64decode(payload, validate=True)
            except (binascii.Error, ValueError):
                raise APIError(400, "ref_audio is not valid base64", "ref_audio", "invalid_base64") from None
            return self._decode(raw)
        if ref.startswith("file://"):
            if self.allowed is None:
                raise APIError(400, "local ref_audio paths are disabled; start the server with "
                                    "--allowed-local-media-path", "ref_audio", "local_media_disabled")
            path = Path(ref[len("file://"):])
            real = path.resolve()
            if not real.is_relative_to(self.allowed):
                raise APIError(403, "ref_audio path is outside the allowed media directory", "ref_audio",
                               "path_not_allowed")
            if not real.is_file():
                raise APIError(400, f"ref_audio file not found: {path}", "ref_audio")
            if real.stat().st_size > MAX_REF_AUDIO_BYTES:
                raise APIError(400, "ref_audio is too large", "ref_audio")
            return self._decode(real.read_bytes())
        if ref.startswith(("http://", "https://")):
            raise APIError(400, "ref_audio URLs are not fetched by this server; send a data URL", "ref_audio")
        raise APIError(400, "ref_audio must be a data: URL or a file:// path", "ref_audio")

    @staticmethod
    def _decode(raw: bytes) -> tuple[np.ndarray, int]:
        if len(raw) > MAX_REF_AUDIO_BYTES:
            raise APIError(400, "ref_audio is too large", "ref_audio")
        try:
            audio, sr = sf.read(io.BytesIO(raw), dtype="float32", always_2d=True)
        except Exception:   # libsndfile reports every undecodable input its own way
            raise APIError(400, "ref_audio is not decodable audio", "ref_audio", "invalid_audio") from None
        if audio.shape[0] == 0:
            raise APIError(400, "ref_audio holds no samples", "ref_audio", "invalid_audio")
        return audio.mean(axis=1), sr


def to_request(body: SpeechBody, model_id: str, refs: ReferenceLoader) -> SpeechRequest:
    """The engine request a body asks for, or a 4xx naming the field this server cannot honour."""
    if body.model not in (model_id, "tts-1", "tts-1-hd", "gpt-4o-mini-tts"):
        raise APIError(404, f"model {body.model!r} does not exist; this server serves {model_id!r}",
                       "model", "model_not_found")
    if body.response_format not in ("wav", "pcm", "flac"):
        raise APIError(400, f"response_format {body.response_format!r} is not supported; use wav, pcm or flac",
                       "response_format", "unsupported_format")
    if body.speed != 1.0:
        raise APIError(400, "speed other than 1.0 is not supported", "speed", "unsupported_speed")
    if body.streams and body.response_format not in STREAMABLE:
        raise APIError(400, f"streaming needs response_format pcm or wav, not {body.response_format}",
                       "response_format", "format_not_streamable")
    if len(body.input) > MAX_INPUT_CHARS:
        raise APIError(400, f"input is {len(body.input)} characters; at most {MAX_INPUT_CHARS}", "input",
                       "input_too_long")
    ref_audio, ref_sr = refs.load(body.ref_audio) if body.ref_audio else (None, SAMPLE_RATE)
    req = SpeechRequest(text=body.input, task_type=body.task_type, voice=body.voice,
                        instructions=body.instructions, ref_audio=ref_audio, ref_sample_rate=ref_sr,
                        ref_text=body.ref_text, language=body.language, seed=body.seed,
                        temperature=body.temperature, max_new_tokens=body.max_new_tokens)
    try:
        req.validate()
    except RequestError as e:
        raise APIError(400, str(e), e.param, "invalid_value") from None
    return req
