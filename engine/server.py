"""Online serving: an OpenAI-compatible `/v1/audio/speech` over the engine.

Every error is OpenAI-shaped JSON (`{"error": {"message", "type", "param", "code"}}`)
and leaves the server serving.  A streamed request is released in the engine as soon
as its client goes away.  SIGTERM lets in-flight requests finish (uvicorn's graceful
shutdown), then closes the engine, which ends every stage process.
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import io
import json
import os
import struct
import time
from pathlib import Path
from typing import Literal

import numpy as np
import soundfile as sf
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from pydantic import BaseModel, ConfigDict, Field

from engine.engine import TTSEngine
from engine.presets import SAMPLE_RATE
from engine.request import (MAX_INPUT_CHARS, MAX_NEW_TOKENS, MAX_SEED, MAX_TEMPERATURE, RequestError,
                            SpeechRequest)

MODEL_ID = "qwen3-tts"
MEDIA_TYPES = {"wav": "audio/wav", "pcm": "audio/pcm", "flac": "audio/flac", "mp3": "audio/mpeg",
               "opus": "audio/opus"}
STREAMABLE = ("wav", "pcm")
MAX_REF_AUDIO_BYTES = 20 * 1024 * 1024
_TAKEN = object()


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


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type_: str = "invalid_request_error", extra: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type, self.extra = \
            status, message, param, code, type_, extra

    def body(self) -> dict:
        err = {"message": self.message, "type": self.type, "param": self.param, "code": self.code}
        if self.extra:
            err["diagnosis"] = self.extra
        return {"error": err}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


def engine_error(error: dict) -> APIError:
    """An engine-side failure (stall, dead stage, ...) as a 5xx with the structured diagnosis."""
    kind = error.get("kind", "EngineError")
    if kind == "RequestFailed":   # the stage refused this request (e.g. longer than max_model_len)
        return APIError(400, error.get("message", kind), "input", "request_refused", extra=error)
    status = 503 if kind in ("StageDied", "StageCrashed", "EngineClosed") else 500
    return APIError(status, error.get("message", kind), code=kind, type_="server_error", extra=error)


class Metrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        self.requests = Counter("lanekeeper_requests", "Speech requests by final status", ["status"],
                                registry=self.registry)
        self.ttfp = Histogram("lanekeeper_time_to_first_audio_seconds", "Time to the first audio packet",
                              registry=self.registry,
                              buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
        self.rtf = Histogram("lanekeeper_real_time_factor", "Request latency / audio duration",
                             registry=self.registry, buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8))
        self.audio = Counter("lanekeeper_audio_seconds", "Audio seconds produced", registry=self.registry)
        self.in_flight = Gauge("lanekeeper_requests_in_flight", "Requests being served", registry=self.registry)
        self.queue_depth = Gauge("lanekeeper_stage_queue_depth", "Requests waiting or running per stage",
                                 ["stage"], registry=self.registry)

    def finish(self, status: str, started: float, first_audio: float | None, audio_s: float) -> None:
        self.requests.labels(status=status).inc()
        if first_audio is not None:
            self.ttfp.observe(first_audio - started)
        if audio_s > 0:
            self.audio.inc(audio_s)
            self.rtf.observe((time.monotonic() - started) / audio_s)


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


def create_app(engine_factory, allowed_local_media_path: str | None = None,
               model_id: str = MODEL_ID) -> FastAPI:
    """`engine_factory()` builds the engine at start-up; the app closes it at shutdown."""
    state: dict = {"engine": None, "shutting_down": False}
    metrics = Metrics()
    refs = ReferenceLoader(allowed_local_media_path)

    async def lifespan(app):
        state["engine"] = await asyncio.get_running_loop().run_in_executor(None, engine_factory)
        try:
            yield
        finally:
            state["shutting_down"] = True
            await asyncio.get_running_loop().run_in_executor(None, state["engine"].close)

    app = FastAPI(title="lanekeeper speech", lifespan=lifespan)
    app.state.lanekeeper = state
    app.state.metrics = metrics

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        err = exc.errors()[0]
        loc = [str(p) for p in err.get("loc", ()) if p != "body"]
        if err.get("type") == "json_invalid" or (not loc and err.get("type") in ("model_attributes_type",
                                                                                  "dict_type", "missing")):
            return APIError(400, "request body is not a valid JSON object", code="invalid_json").response()
        param = ".".join(loc) or None
        msg = "unknown field" if err.get("type") == "extra_forbidden" else err.get("msg", "invalid request")
        return APIError(400, f"{param}: {msg}" if param else msg, param).response()

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return exc.response()

    @app.get("/health")
    async def health():
        engine: TTSEngine | None = state["engine"]
        if engine is None or state["shutting_down"] or engine.closed:
            return JSONResponse({"status": "shutting_down"}, status_code=503)
        dead = engine.dead_stages()
        if dead:
            return JSONResponse({"status": "unhealthy", "dead_stages": dead}, status_code=503)
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_id, "object": "model", "owned_by": "lanekeeper",
                                            "created": 0}]}

    @app.get("/metrics")
    async def prometheus():
        engine = state["engine"]
        if engine is not None:
            for stage, depth in engine.queue_depths().items():
                metrics.queue_depth.labels(stage=str(stage)).set(depth)
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/audio/speech")
    async def speech(body: SpeechBody, request: Request):
        engine: TTSEngine | None = state["engine"]
        if engine is None or state["shutting_down"]:
            raise APIError(503, "server is shutting down", code="shutting_down", type_="server_error")
        if body.model not in (model_id, "tts-1", "tts-1-hd", "gpt-4o-mini-tts"):
            raise APIError(404, f"model {body.model!r} does not exist; this server serves {model_id!r}",
                           "model", "model_not_found")
        if body.response_format not in ("wav", "pcm", "flac"):
            raise APIError(400, f"response_format {body.response_format!r} is not supported; use wav, pcm or flac",
                           "response_format", "unsupported_format")
        if body.speed != 1.0:
            raise APIError(400, "speed other than 1.0 is not supported", "speed", "unsupported_speed")
        if body.stream and body.response_format not in STREAMABLE:
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
            raise APIError(400, str(e), e.param) from None

        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        started = time.monotonic()
        tracked = engine.submit(req, listener=lambda item: loop.call_soon_threadsafe(events.put_nowait, item))
        metrics.in_flight.inc()
        book = {"first": None, "audio_s": 0.0, "done": False}

        def finish(status: str) -> None:
            if not book["done"]:
                book["done"] = True
                metrics.in_flight.dec()
                metrics.finish(status, started, book["first"], book["audio_s"])

        try:
            first_item = await events.get()   # so that a request refused up front gets a proper status
        except asyncio.CancelledError:
            engine.abort(req.request_id)
            finish("cancelled")
            raise
        if first_item is None and tracked.error is not None:
            finish("error")
            raise engine_error(tracked.error)

        async def chunks():
            """Audio arrays as they arrive; raises APIError on an engine failure."""
            item = first_item
            while True:
                if item is _TAKEN:
                    item = await events.get()
                if item is None:
                    if tracked.error is not None:
                        raise engine_error(tracked.error)
                    return
                if len(item.audio):
                    book["first"] = book["first"] or time.monotonic()
                    book["audio_s"] += len(item.audio) / SAMPLE_RATE
                audio, item = item.audio, _TAKEN
                yield audio

        if not body.stream:
            try:
                parts = [a async for a in chunks()]
            except APIError:
                finish("error")
                raise
            except asyncio.CancelledError:
                engine.abort(req.request_id)
                finish("cancelled")
                raise
            finish("success")
            audio = np.concatenate(parts) if parts else np.zeros(0, np.float32)
            return Response(encode(audio, body.response_format), media_type=MEDIA_TYPES[body.response_format])

        async def stream_audio():
            try:
                if body.response_format == "wav":
                    yield wav_header()
                async for audio in chunks():
                    yield pcm16(audio)
                finish("success")
            except APIError:
                finish("error")   # headers are gone; ending the body early is all HTTP allows
            finally:
                if not book["done"]:
                    engine.abort(req.request_id)
                    finish("cancelled")

        async def stream_sse():
            frames = 0
            try:
                first = True
                async for audio in chunks():
                    data = pcm16(audio)
                    if first and body.response_format == "wav":
                        data = wav_header() + data
                    first = False
                    frames += len(audio) // 1920
                    yield f"data: {json.dumps({'type': 'speech.audio.delta', 'audio': base64.b64encode(data).decode()})}\n\n"
                usage = {"input_tokens": len(body.input.encode()), "output_tokens": frames,
                         "total_tokens": len(body.input.encode()) + frames}
                yield f"data: {json.dumps({'type': 'speech.audio.done', 'usage': usage})}\n\n"
                finish("success")
            except APIError as e:
                yield f"data: {json.dumps({'type': 'speech.audio.error', **e.body()})}\n\n"
                finish("error")
            finally:
                if not book["done"]:
                    engine.abort(req.request_id)
                    finish("cancelled")

        if body.stream_format == "sse":
            return StreamingResponse(stream_sse(), media_type="text/event-stream")
        return StreamingResponse(stream_audio(), media_type=MEDIA_TYPES[body.response_format])

    return app


def serve(profile, host: str = "127.0.0.1", port: int = 8000, allowed_local_media_path: str | None = None,
          graceful_timeout: float = 30.0) -> None:
    import uvicorn

    if allowed_local_media_path and not os.path.isdir(allowed_local_media_path):
        raise RequestError(f"--allowed-local-media-path {allowed_local_media_path}: not a directory",
                           "allowed_local_media_path")
    app = create_app(lambda: TTSEngine(profile), allowed_local_media_path)
    uvicorn.run(app, host=host, port=port, log_level="info", timeout_graceful_shutdown=graceful_timeout)
