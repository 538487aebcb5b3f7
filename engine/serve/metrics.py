"""Prometheus metrics of the speech server, and `Call`: one request, counted exactly once by how it
ended, and released in the engine on every way out but success."""
from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from engine.models.presets import SAMPLE_RATE


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
        self.stage_seconds = Gauge("lanekeeper_stage_seconds", "Seconds each stage of the current engine has "
                                   "spent in each part of its loop (stage 0: decode, admit, readback, handoff, inbox; "
                                   "stage 1: decode)", ["stage", "part"], registry=self.registry)
        self.code2wav_windows = Gauge("lanekeeper_code2wav_windows", "Windows the current engine's stage 1 has "
                                      "decoded", registry=self.registry)
        self.code2wav_passes = Gauge("lanekeeper_code2wav_passes", "Codec passes those windows took: windows per "
                                     "pass is how well stage 1 batches", registry=self.registry)
        self.code2wav_frames = Gauge("lanekeeper_code2wav_frames", "Frames stage 1 has decoded: the windows' own "
                                     "(context included), and what their passes ran (padding included)", ["of"],
                                     registry=self.registry)
        self.code2wav_replay = Gauge("lanekeeper_code2wav_replay_seconds", "The captured codec passes stage 1 has "
                                     "run, at the device time each took alone when it was timed at start-up",
                                     registry=self.registry)
        for status in ("success", "error", "cancelled", "rejected"):
            self.requests.labels(status=status)


class Call:
    """One speech request from arrival to its end.  `end` is the one way out: it counts the request once,
    by status, and aborts it in the engine unless the engine already finished it (a client gone, a failed
    stream, a cancelled handler)."""

    def __init__(self, metrics: Metrics):
        self.metrics, self.started = metrics, time.monotonic()
        self.first_audio: float | None = None
        self.audio_s = 0.0
        self.done = False
        self.engine = self.tracked = None   # once submitted
        metrics.in_flight.inc()

    def submitted(self, engine, tracked) -> None:
        self.engine, self.tracked = engine, tracked

    @property
    def request_id(self) -> str | None:
        return self.tracked.request.request_id if self.tracked is not None else None

    def audio(self, samples: int) -> None:
        if samples:
            self.first_audio = self.first_audio or time.monotonic()
            self.audio_s += samples / SAMPLE_RATE

    def end(self, status: str) -> None:
        if self.done:
            return
        self.done = True
        if self.tracked is not None and not self.tracked.done.is_set():
            self.engine.abort(self.tracked.request.request_id)
        m = self.metrics
        m.in_flight.dec()
        m.requests.labels(status=status).inc()
        if self.first_audio is not None:
            m.ttfp.observe(self.first_audio - self.started)
        if self.audio_s > 0:
            m.audio.inc(self.audio_s)
            m.rtf.observe((time.monotonic() - self.started) / self.audio_s)
