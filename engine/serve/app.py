"""Online serving: an OpenAI-compatible `/v1/audio/speech` over the engine.

Every error is OpenAI-shaped JSON (`{"error": {"message", "type", "param", "code"}}`),
the framework's own (a body that is not JSON, an unknown route) included, and leaves the
server serving.  A 5xx carries an error `id` that finds its entry, traceback and all, in
the server log; responses never carry tracebacks.  A streamed request is released in the
engine as soon as its client goes away; a raw audio stream that fails midway is cut off
without its last chunk, so a client sees a broken transfer, not a short success.

A dead or stalled stage gets the engine replaced (engine/runtime/supervisor.py); `/health` says
`restarting`, then `ok`.  SIGTERM lets in-flight requests finish (uvicorn's graceful
shutdown), then closes the engine, which ends every stage process.
"""
from __future__ import annotations

import asyncio
import base64
import json
import logging

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from engine.serve.api_errors import APIError, engine_error, install_handlers
from engine.serve.audio_out import MEDIA_TYPES, AudioStream, StreamCut, encode, pcm16, wav_header
from engine.runtime.engine import TTSEngine
from engine.errors import EngineError
from engine.serve.metrics import Call, Metrics
from engine.models.presets import SAMPLES_PER_FRAME
from engine.request import SpeechRequest
from engine.stage.stats import Code2WavStats
from engine.serve.speech_body import MODEL_ID, ReferenceLoader, SpeechBody, parse_body, read_body, to_request
from engine.runtime.supervisor import RestartPolicy, Supervisor

log = logging.getLogger("lanekeeper.server")

class Service:
    """What the routes share: the supervised engine, the metrics, where reference audio may come from."""

    def __init__(self, engine_factory, allowed_local_media_path: str | None, model_id: str, policy: RestartPolicy,
                 on_give_up):
        self.metrics = Metrics()
        self.sup = Supervisor(engine_factory, policy, on_give_up=on_give_up, on_restart=self.metrics.restarts.inc)
        self.refs = ReferenceLoader(allowed_local_media_path)
        self.model_id = model_id
        self.shutting_down = False

    def unavailable(self) -> APIError | None:
        """Why no request can be served now, or None."""
        sup = self.sup
        if self.shutting_down:
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
            return engine_error(verdict, status=503, headers={"Retry-After": "1"})
        return None

    async def health(self):
        down = self.unavailable()
        engine = self.sup.engine
        dead = engine.dead_stages() if engine is not None and not engine.closed else []   # before the watchdog's tick
        if down is None and not dead:
            return {"status": "ok", "restarts": self.sup.restarts}
        if down is None:
            return JSONResponse({"status": "unhealthy", "dead_stages": dead,
                                 "reason": f"stage(s) {', '.join(map(str, dead))} exited"}, status_code=503)
        status = {"engine_restarting": "restarting", "shutting_down": "shutting_down",
                  "engine_starting": "starting"}.get(down.code, "unhealthy")
        body = {"status": status, "reason": down.message, "restarts": self.sup.restarts}
        if down.diagnosis is not None:
            body["stage"] = down.diagnosis.stage
        if dead:
            body["dead_stages"] = dead
        return JSONResponse(body, status_code=503, headers=down.headers)

    async def models(self):
        return {"object": "list", "data": [{"id": self.model_id, "object": "model", "owned_by": "lanekeeper",
                                            "created": 0}]}

    async def prometheus(self):
        engine = self.sup.engine
        if engine is not None and not engine.closed:
            for stage, depth in engine.queue_depths().items():
                self.metrics.queue_depth.labels(stage=str(stage)).set(depth)
            for stage, (_, stats) in sorted(engine.beats.items()):
                for part, seconds in stats.seconds.items():
                    self.metrics.stage_seconds.labels(stage=str(stage), part=part).set(seconds)
                if isinstance(stats, Code2WavStats):
                    self.metrics.code2wav_windows.set(stats.windows)
                    self.metrics.code2wav_passes.set(stats.passes)
                    self.metrics.code2wav_frames.labels(of="windows").set(stats.window_frames)
                    self.metrics.code2wav_frames.labels(of="passes").set(stats.pass_frames)
                    self.metrics.code2wav_replay.set(stats.replay_s)
        return Response(generate_latest(self.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def speech(self, request: Request):
        """One speech request, ended through `call.end` whichever way it goes."""
        call = Call(self.metrics)
        try:
            body = parse_body(await read_body(request))
            audio = await self.start(to_request(body, self.model_id, self.refs), call)
            if not body.streams:
                parts = [a async for a in audio]
                call.end("success")
                return Response(encode(np.concatenate(parts) if parts else np.zeros(0, np.float32),
                                       body.response_format), media_type=MEDIA_TYPES[body.response_format])
            if body.stream_format == "sse":
                return AudioStream(sse_events(body, audio, call), lambda: call.end("cancelled"),
                                   media_type="text/event-stream")
            return AudioStream(raw_audio(body, audio, call), lambda: call.end("cancelled"),
                               media_type=MEDIA_TYPES[body.response_format])
        except APIError as e:
            call.end("rejected" if e.status < 500 else "error")
            raise
        except asyncio.CancelledError:   # the client went away
            call.end("cancelled")
            raise
        except BaseException:
            call.end("error")
            raise

    async def start(self, req: SpeechRequest, call: Call):
        """Submit, and wait for the first audio (or the failure), so that a request refused up front gets a
        proper status instead of a broken stream.  Returns the audio arrays as an async iterator."""
        down = self.unavailable()
        if down is not None:
            raise down
        engine: TTSEngine = self.sup.engine
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        try:
            tracked = engine.submit(req, listener=lambda item: loop.call_soon_threadsafe(events.put_nowait, item))
        except EngineError:   # closed between the check and the submit: a restart began
            raise self.unavailable() or APIError(503, "engine is closed", code="EngineClosed", type_="server_error")
        call.submitted(engine, tracked)
        first = await events.get()
        if first is None and tracked.error is not None:
            raise engine_error(tracked.error)

        async def arrays():
            item = first
            while item is not None:
                call.audio(len(item.audio))
                yield item.audio
                item = await events.get()
            if tracked.error is not None:
                raise engine_error(tracked.error)

        return arrays()


async def raw_audio(body: SpeechBody, audio, call: Call):
    """PCM (after a WAV header, for wav), cut off without its last chunk if the engine fails midway."""
    sent = 0
    if body.response_format == "wav":
        yield wav_header()
    try:
        async for part in audio:
            data = pcm16(part)
            sent += len(data)
            yield data
    except APIError as e:
        e.body()   # logged under its error id
        log.error("%s: audio stream of request %s cut off after %d bytes", e.error_id, call.request_id, sent)
        call.end("error")
        raise StreamCut() from None
    call.end("success")


async def sse_events(body: SpeechBody, audio, call: Call):
    """speech.audio.delta events, then speech.audio.done with usage, or speech.audio.error."""
    frames, first = 0, True
    try:
        async for part in audio:
            data = pcm16(part)
            if first and body.response_format == "wav":
                data = wav_header() + data
            first = False
            frames += len(part) // SAMPLES_PER_FRAME
            yield _event({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})
        tokens = len(body.input.encode())
        yield _event({"type": "speech.audio.done",
                      "usage": {"input_tokens": tokens, "output_tokens": frames, "total_tokens": tokens + frames}})
        call.end("success")
    except APIError as e:
        yield _event({"type": "speech.audio.error", **e.body()})
        call.end("error")


def _event(data: dict) -> str:
    return f"data: {json.dumps(data)}\n\n"


def _raise(error: Exception):
    raise error


def create_app(engine_factory, allowed_local_media_path: str | None = None, model_id: str = MODEL_ID,
               policy: RestartPolicy = RestartPolicy(), on_give_up=lambda reason: None,
               on_start_failed=_raise) -> FastAPI:
    """`engine_factory()` builds an engine at start-up and after each restart; the app closes it at shutdown.
    `on_give_up(reason)` is called once the engine failed past the restart limit; `on_start_failed(error)`
    when the first engine never started (by default the error fails the app's start-up)."""
    svc = Service(engine_factory, allowed_local_media_path, model_id, policy, on_give_up)

    async def lifespan(app):
        try:
            await asyncio.get_running_loop().run_in_executor(None, svc.sup.start_engine)
        except Exception as e:
            on_start_failed(e)
            svc.shutting_down = True   # nothing is served while the server exits
        try:
            yield
        finally:
            svc.shutting_down = True
            await asyncio.get_running_loop().run_in_executor(None, svc.sup.stop)

    app = FastAPI(title="lanekeeper speech", lifespan=lifespan)
    install_handlers(app)
    app.get("/health")(svc.health)
    app.get("/v1/models")(svc.models)
    app.get("/metrics")(svc.prometheus)
    app.post("/v1/audio/speech")(svc.speech)
    return app
