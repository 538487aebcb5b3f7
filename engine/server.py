"""Online serving: an OpenAI-compatible `/v1/audio/speech` over the engine.

Every error is OpenAI-shaped JSON (`{"error": {"message", "type", "param", "code"}}`),
the framework's own (a body that is not JSON, an unknown route) included, and leaves the
server serving.  A 5xx carries an error `id` that finds its entry, traceback and all, in
the server log; responses never carry tracebacks.  A streamed request is released in the
engine as soon as its client goes away; a raw audio stream that fails midway is cut off
without its last chunk, so a client sees a broken transfer, not a short success.

A dead or stalled stage gets the engine replaced (engine/supervisor.py); `/health` says
`restarting`, then `ok`.  SIGTERM lets in-flight requests finish (uvicorn's graceful
shutdown), then closes the engine, which ends every stage process.
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import io
import json
import os
import logging
import struct
import time
import traceback
import uuid
from pathlib import Path
from typing import Literal

import numpy as np
import soundfile as sf
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.exceptions import HTTPException

from engine.engine import TTSEngine
from engine.errors import EngineError
from engine.presets import SAMPLE_RATE
from engine.request import (MAX_INPUT_CHARS, MAX_NEW_TOKENS, MAX_SEED, MAX_TEMPERATURE, RequestError,
                            SpeechRequest)
from engine.supervisor import RestartPolicy, Supervisor

log = logging.getLogger("lanekeeper.server")

MODEL_ID = "qwen3-tts"
MEDIA_TYPES = {"wav": "audio/wav", "pcm": "audio/pcm", "flac": "audio/flac", "mp3": "audio/mpeg",
               "opus": "audio/opus"}
STREAMABLE = ("wav", "pcm")
MAX_REF_AUDIO_BYTES = 20 * 1024 * 1024
MAX_BODY_BYTES = 32 * 1024 * 1024   # a base64 ref_audio at its cap, plus the rest of the body
EXIT_STARTUP_FAILED = 3             # as uvicorn: the engine never started
EXIT_GAVE_UP = 4                    # the engine kept failing past the restart limit
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
                 type_: str = "invalid_request_error", extra: dict | None = None, headers: dict | None = None,
                 trace: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type, self.extra = \
            status, message, param, code, type_, extra
        self.headers = headers
        self.trace = trace or (extra or {}).get("traceback")
        self.error_id: str | None = None

    def body(self) -> dict:
        """The OpenAI error object.  A server error is logged here, once, under the id the client gets."""
        err = {"message": self.message, "type": self.type, "param": self.param, "code": self.code}
        if self.status >= 500:
            if self.error_id is None:
                self.error_id = "err_" + uuid.uuid4().hex[:16]
                detail = json.dumps({k: v for k, v in (self.extra or {}).items() if k != "traceback"}, default=str)
                log.error("%s: %d %s: %s %s%s", self.error_id, self.status, self.code, self.message, detail,
                          "\n" + self.trace if self.trace else "")
            err["id"] = self.error_id
            err["message"] = f"{self.message} (error id {self.error_id} in the server log)"
        if self.extra:
            err["diagnosis"] = {k: v for k, v in self.extra.items() if k != "traceback"}
        return {"error": err}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def engine_error(error: dict) -> APIError:
    """An engine-side failure (stall, dead stage, ...) as a 5xx with the structured diagnosis."""
    kind = error.get("kind", "EngineError")
    if kind == "RequestFailed":   # the stage refused this request (e.g. longer than max_model_len)
        return APIError(400, error.get("message", kind), "input", "request_refused", extra=error)
    status = 503 if kind in ("StageDied", "StageCrashed", "EngineClosed") else 500
    return APIError(status, error.get("message", kind), code=kind, type_="server_error", extra=error)


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


class Metrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        self.requests = Counter("lanekeeper_requests", "Speech requests by final status: success, error, "
                                "cancelled (client gone), rejected (4xx before the engine)", ["status"],
                                registry=self.registry)
        self.restarts = Counter("lanekeeper_engine_restarts", "Engines replaced after a dead or stalled stage",
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
        for status in ("success", "error", "cancelled", "rejected"):
            self.requests.labels(status=status)


class Call:
    """One speech request from arrival to its end, counted exactly once, by how it ended."""

    def __init__(self, metrics: Metrics):
        self.metrics, self.started = metrics, time.monotonic()
        self.first_audio: float | None = None
        self.audio_s = 0.0
        self.done = False
        metrics.in_flight.inc()

    def audio(self, samples: int) -> None:
        if samples:
            self.first_audio = self.first_audio or time.monotonic()
            self.audio_s += samples / SAMPLE_RATE

    def finish(self, status: str) -> None:
        if self.done:
            return
        self.done = True
        m = self.metrics
        m.in_flight.dec()
        m.requests.labels(status=status).inc()
        if self.first_audio is not None:
            m.ttfp.observe(self.first_audio - self.started)
        if self.audio_s > 0:
            m.audio.inc(self.audio_s)
            m.rtf.observe((time.monotonic() - self.started) / self.audio_s)


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


def create_app(engine_factory, allowed_local_media_path: str | None = None, model_id: str = MODEL_ID,
               policy: RestartPolicy = RestartPolicy(), on_give_up=lambda reason: None) -> FastAPI:
    """`engine_factory()` builds an engine at start-up and after each restart; the app closes it at shutdown.
    `on_give_up(reason)` is called once the engine failed past the restart limit."""
    state = {"shutting_down": False}
    metrics = Metrics()
    sup = Supervisor(engine_factory, policy, on_give_up=on_give_up, on_restart=metrics.restarts.inc)
    refs = ReferenceLoader(allowed_local_media_path)

    async def lifespan(app):
        await asyncio.get_running_loop().run_in_executor(None, sup.start_engine)
        try:
            yield
        finally:
            state["shutting_down"] = True
            await asyncio.get_running_loop().run_in_executor(None, sup.stop)

    app = FastAPI(title="lanekeeper speech", lifespan=lifespan)
    app.state.supervisor = sup
    app.state.metrics = metrics

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return exc.response()

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        message = f"{request.method} {request.url.path}: {exc.detail}"
        return APIError(exc.status_code, message, code=code, headers=exc.headers).response()

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception):
        trace = "".join(traceback.format_exception(exc))
        return APIError(500, f"internal server error ({type(exc).__name__})", code="internal_error",
                        type_="server_error", trace=trace).response()

    def unavailable() -> APIError | None:
        """Why no request can be served now, or None."""
        if state["shutting_down"]:
            return APIError(503, "server is shutting down", code="shutting_down", type_="server_error")
        if sup.state == "starting":
            return APIError(503, "engine is starting", code="engine_starting", type_="server_error",
                            headers={"Retry-After": "5"})
        if sup.state == "restarting":
            return APIError(503, f"engine is restarting after: {sup.reason}", code="engine_restarting",
                            type_="server_error", headers={"Retry-After": str(max(1, round(sup.retry_after)))})
        if sup.state == "failed":
            return APIError(503, f"engine failed past its restart limit: {sup.reason}", code="engine_failed",
                            type_="server_error")
        verdict = sup.engine.verdict()
        if verdict is not None:
            return APIError(503, verdict["message"], code=verdict["kind"], type_="server_error", extra=verdict,
                            headers={"Retry-After": "1"})
        return None

    @app.get("/health")
    async def health():
        down = unavailable()
        if down is None:
            dead = sup.engine.dead_stages()   # before the watchdog's next tick has seen it
            if not dead:
                return {"status": "ok", "restarts": sup.restarts}
            return JSONResponse({"status": "unhealthy", "dead_stages": dead,
                                 "reason": f"stage(s) {', '.join(map(str, dead))} exited"}, status_code=503)
        status = {"engine_restarting": "restarting", "shutting_down": "shutting_down",
                  "engine_starting": "starting"}.get(down.code, "unhealthy")
        body = {"status": status, "reason": down.message, "restarts": sup.restarts}
        if down.extra:
            body["stage"] = down.extra.get("stage")
        dead = sup.engine.dead_stages() if sup.engine is not None and not sup.engine.closed else []
        if dead:
            body["dead_stages"] = dead
        return JSONResponse(body, status_code=503, headers=down.headers)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_id, "object": "model", "owned_by": "lanekeeper",
                                            "created": 0}]}

    @app.get("/metrics")
    async def prometheus():
        engine = sup.engine
        if engine is not None and not engine.closed:
            for stage, depth in engine.queue_depths().items():
                metrics.queue_depth.labels(stage=str(stage)).set(depth)
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/audio/speech")
    async def speech(request: Request):
        call = Call(metrics)
        try:
            return await synthesize(request, call)
        except APIError as e:
            call.finish("rejected" if e.status < 500 else "error")
            raise
        except asyncio.CancelledError:
            call.finish("cancelled")
            raise
        except BaseException:
            call.finish("error")
            raise

    def to_request(body: SpeechBody) -> SpeechRequest:
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
            raise APIError(400, str(e), e.param, "invalid_value") from None
        return req

    async def synthesize(request: Request, call: Call):
        body = parse_body(await read_body(request))
        req = to_request(body)
        down = unavailable()
        if down is not None:
            raise down
        engine: TTSEngine = sup.engine
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        try:
            tracked = engine.submit(req, listener=lambda item: loop.call_soon_threadsafe(events.put_nowait, item))
        except EngineError:   # closed between the check and the submit: a restart began
            raise unavailable() or APIError(503, "engine is closed", code="EngineClosed", type_="server_error")

        try:
            first_item = await events.get()   # so that a request refused up front gets a proper status
        except asyncio.CancelledError:
            engine.abort(req.request_id)
            raise
        if first_item is None and tracked.error is not None:
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
                call.audio(len(item.audio))
                audio, item = item.audio, _TAKEN
                yield audio

        if not body.stream:
            try:
                parts = [a async for a in chunks()]
            except asyncio.CancelledError:
                engine.abort(req.request_id)
                raise
            call.finish("success")
            audio = np.concatenate(parts) if parts else np.zeros(0, np.float32)
            return Response(encode(audio, body.response_format), media_type=MEDIA_TYPES[body.response_format])

        def closed() -> None:
            if not call.done:   # the client went away, or the body never started
                engine.abort(req.request_id)
                call.finish("cancelled")

        async def stream_audio():
            sent = 0
            if body.response_format == "wav":
                yield wav_header()
            try:
                async for audio in chunks():
                    data = pcm16(audio)
                    sent += len(data)
                    yield data
            except APIError as e:
                e.body()   # logged under its error id
                log.error("%s: audio stream of request %s cut off after %d bytes", e.error_id, req.request_id, sent)
                call.finish("error")
                raise StreamCut() from None
            call.finish("success")

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
                call.finish("success")
            except APIError as e:
                yield f"data: {json.dumps({'type': 'speech.audio.error', **e.body()})}\n\n"
                call.finish("error")

        if body.stream_format == "sse":
            return AudioStream(stream_sse(), closed, media_type="text/event-stream")
        return AudioStream(stream_audio(), closed, media_type=MEDIA_TYPES[body.response_format])

    return app


def serve(profile, host: str = "127.0.0.1", port: int = 8000, allowed_local_media_path: str | None = None,
          graceful_timeout: float = 30.0, policy: RestartPolicy = RestartPolicy()) -> int:
    """Serve until SIGTERM/SIGINT (0), or until the engine failed past the restart limit (EXIT_GAVE_UP)."""
    import uvicorn

    if allowed_local_media_path and not os.path.isdir(allowed_local_media_path):
        raise RequestError(f"--allowed-local-media-path {allowed_local_media_path}: not a directory",
                           "allowed_local_media_path")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    outcome = {"code": 0}
    server: uvicorn.Server | None = None

    def give_up(reason: str) -> None:
        outcome["code"] = EXIT_GAVE_UP
        server.should_exit = True   # uvicorn's own shutdown: in-flight requests end, the lifespan closes

    app = create_app(lambda: TTSEngine(profile), allowed_local_media_path, policy=policy, on_give_up=give_up)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="info",
                                           timeout_graceful_shutdown=graceful_timeout))
    server.run()
    if not server.started:
        return EXIT_STARTUP_FAILED
    return outcome["code"]
