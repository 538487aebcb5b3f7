"""The offline engine: spawns the two stage processes and routes requests and audio.

    with TTSEngine(resolve("qwen3_tts")) as engine:
        results = engine.generate([SpeechRequest("Hello.")])

The stages run in processes forked from multiprocessing's fork server (see `stage_context`); they
form one process group led by stage 0.
`close()` asks them to stop, then kills the whole group, so nothing outlives the
engine even when a stage is wedged.
"""
from __future__ import annotations

import dataclasses
import queue
import threading
import time
import weakref
from typing import Iterable, Iterator

import numpy as np

from engine.profile.resolve import ResolvedProfile
from engine.diagnosis import Diagnosis
from engine.errors import EngineError, failure
from engine.profile.faults import from_env as faults_from_env, parse as parse_faults
from engine.stage.messages import Abort, Add, Beat, Codes, Decoded, Fatal, Ready, StageError, Stop
from engine.models.presets import CODEBOOKS, SAMPLE_RATE, SAMPLES_PER_FRAME
from engine.process.queues import ClosedQueue, close_queues
from engine.process.tree import kill_tree, tree_pids
from engine.runtime.devices import usable_platform
from engine.runtime.launch import stage_context, start_stages
from engine.runtime.registry import REGISTRY
from engine.stage.stats import STATS
from engine.request import AudioChunk, RequestError, SpeechRequest, SpeechResult
from engine.runtime.tracked import Tracked
from engine.runtime.watchdog import Watchdog


class TTSEngine:
    def __init__(self, profile: ResolvedProfile, start_timeout: float = 300.0, cpu_fallback: bool = False):
        self.profile = profile = dataclasses.replace(
            profile, runs_on=usable_platform(profile.platform, cpu_fallback))
        self.closed = False
        self.info: dict[int, dict] = {}
        self.beats: dict[int, tuple[float, object]] = {}   # stage -> (when, its TalkerStats / Code2WavStats)
        self.fatal: Fatal | None = None   # a stage's loop raised
        resolved = profile.flat()   # a fault with when=KEY:VALUE acts only where the profile resolves to it
        self.faults = [f for f in parse_faults(profile.config.faults, "profile faults") + faults_from_env()
                       if f.applies(resolved)]
        ctx = stage_context(profile.config.backend)
        self.in_q, self.handoff_q, self.out_q = ctx.Queue(), ctx.Queue(), ctx.Queue()
        self._tracked: dict[str, Tracked] = {}
        self._lock = threading.Lock()
        self.procs = start_stages(ctx, profile, (self.in_q, self.handoff_q, self.out_q), self.faults)
        self._finalizer = weakref.finalize(self, kill_tree, [p.pid for p in self.procs], self.procs[0].pid)
        REGISTRY.register(self)
        try:
            self._wait_ready(start_timeout)
        except BaseException:
            self.close()
            raise
        self._reader = threading.Thread(target=self._read, name="lanekeeper-output", daemon=True)
        self._reader.start()
        self.watchdog = Watchdog(self)
        self.watchdog.start()

    # ------------------------------------------------------------ lifecycle
    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while len(self.info) < len(self.procs):
            dead = [stage for stage, proc in enumerate(self.procs) if stage not in self.info and not proc.is_alive()]
            if time.monotonic() > deadline:
                raise EngineError(f"engine did not start within {timeout:.0f}s")
            try:   # a stage that failed says why before it exits: read that before blaming the exit
                self._dispatch(self.out_q.get(timeout=0.2))
            except queue.Empty:
                if dead:
                    stage = dead[0]
                    raise EngineError(f"stage {stage} ({self.profile.stage_name(stage)}) exited with code "
                                      f"{self.procs[stage].exitcode} during start-up") from None
                continue
            if self.fatal is not None:
                stage = self.fatal.stage
                raise EngineError(f"stage {stage} ({self.profile.stage_name(stage)}) failed during start-up: "
                                  f"{self.fatal.summary}", detail=self.fatal.traceback)

    def verdict(self) -> Diagnosis | None:
        """Why this engine cannot serve any more (a dead, silent or stuck stage), or None."""
        return self.watchdog.verdict

    def dead_stages(self) -> list[int]:
        return [stage for stage, proc in enumerate(self.procs) if not proc.is_alive()]

    def tracked(self) -> list[Tracked]:
        with self._lock:
            return list(self._tracked.values())

    def handoff_backlog(self) -> int:
        """Windows sent to stage 1 and not yet taken by it."""
        try:
            return self.handoff_q.qsize()
        except (NotImplementedError, AttributeError, OSError):
            return 0

    def fail_request(self, request_id: str, diagnosis: Diagnosis) -> None:
        """Fail one request with a diagnosis and drop it from both stages."""
        self._fail(request_id, diagnosis)
        if not self.closed:
            try:
                self.in_q.put(Abort(request_id))
            except (EngineError, ValueError, OSError):
                pass

    def queue_depths(self) -> dict[int, int]:
        """Requests each stage holds, from its latest heartbeat."""
        return {stage: stats.depth for stage, (_, stats) in sorted(self.beats.items())}

    def pids(self) -> list[int]:
        """The stage processes and what they started (vLLM's engine core and workers, say)."""
        return [] if self.closed else tree_pids([p.pid for p in self.procs if p.pid is not None])

    def kill(self) -> None:
        """End the stages now (a stall or a timeout in a test): what the registry asks of an owner."""
        self.close(timeout=0.5)

    def close(self, timeout: float = 5.0) -> None:
        if self.closed:
            return
        try:
            self.in_q.put(Stop())
            deadline = time.monotonic() + timeout
            for proc in self.procs:
                proc.join(max(0.0, deadline - time.monotonic()))
        finally:
            self.closed = True
            self._finalizer()          # kills the group whatever state the stages are in
            for proc in self.procs:
                proc.join(1)
            self._fail_all(Diagnosis(kind="EngineClosed", message="EngineClosed: the engine closed before the request "
                                                                  "finished"))
            reader = getattr(self, "_reader", None)
            if reader is not None and reader is not threading.current_thread():
                reader.join(2)
            close_queues(self.in_q, self.handoff_q, self.out_q)
            # Drop the queues so their semaphores are released now, not reported as leaked at exit.
            self.in_q = self.handoff_q = self.out_q = ClosedQueue("engine is closed", EngineError)
            REGISTRY.unregister(self)

    def __enter__(self) -> "TTSEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---------------------------------------------------------- output side
    def _read(self) -> None:
        while not self.closed:
            try:
                msg = self.out_q.get(timeout=0.05)   # how long close() waits for this thread
            except (queue.Empty, OSError, ValueError, EOFError, EngineError):
                continue
            self._dispatch(msg)

    def _dispatch(self, msg) -> None:
        """Every message from the stages, by type."""
        match msg:
            case AudioChunk():
                self._audio(msg)
            case Codes(rid, codes, reason, timings):
                t = self._tracked.get(rid)
                if t:
                    t.codes, t.reason, t.stage0_done = codes, reason, True
                    t.progress(produced=len(codes), handed_off=len(codes))
                    t.timings.update(timings)
                    self._maybe_done(t)
            case Beat(stage, stats):
                self.beats[stage] = (time.monotonic(), stats)
                for rid, (produced, handed_off) in getattr(stats, "requests", {}).items():
                    t = self._tracked.get(rid)
                    if t is not None:
                        t.progress(produced=produced, handed_off=handed_off)
            case Ready(stage, info):
                self.info[stage] = info
                self.beats[stage] = (time.monotonic(), STATS[stage]())   # ready is a stage's first sign of life
            case Decoded(rid, seconds):
                t = self._tracked.get(rid)
                if t:
                    t.timings["stage1_s"] = seconds
            case StageError(rid, stage, message, None):   # refused, e.g. longer than max_model_len
                self.fail_request(rid, Diagnosis(kind="RequestFailed", message=message, stage=stage,
                                                 stage_name=self.profile.stage_name(stage)))
            case StageError(rid, stage, summary, tb):
                name = self.profile.stage_name(stage)
                self.fail_request(rid, Diagnosis(
                    kind="StageError", stage=stage, stage_name=name, traceback=tb,
                    message=f"StageError: stage {stage} ({name}) raised {summary} while handling request {rid}; "
                            f"the stage goes on"))
            case Fatal(stage, summary, tb):
                self.fatal = msg
                self._fail_all(Diagnosis(kind="StageCrashed", message=summary, stage=stage, traceback=tb,
                                         stage_name=self.profile.stage_name(stage)))

    def _audio(self, chunk: AudioChunk) -> None:
        t = self._tracked.get(chunk.request_id)
        if t is None:
            return
        if not t.chunks and len(chunk.audio):
            t.timings["first_audio_s"] = time.monotonic() - t.submitted
        t.progress(consumed=len(chunk.audio) // SAMPLES_PER_FRAME)
        t.chunks.append(chunk.audio)
        t.emit(chunk)
        if chunk.final:
            t.audio_done = True
            self._maybe_done(t)

    def _maybe_done(self, t: Tracked) -> None:
        if t.codes is not None and t.audio_done:
            t.timings["total_s"] = time.monotonic() - t.submitted
            self._complete(t)

    def _complete(self, t: Tracked) -> None:
        with self._lock:
            if self._tracked.pop(t.request.request_id, None) is None:
                return
        t.done.set()
        t.emit(None)

    def _fail(self, rid: str, diagnosis: Diagnosis) -> None:
        t = self._tracked.get(rid)
        if t is None:
            return
        t.error = diagnosis if diagnosis.request_id == rid else diagnosis.for_request(rid)
        self._complete(t)

    def _fail_all(self, diagnosis: Diagnosis) -> None:
        for rid in list(self._tracked):
            self._fail(rid, diagnosis)

    # -------------------------------------------------------------- input side
    def submit(self, request: SpeechRequest, listener=None) -> Tracked:
        """Queue one request.  `listener(item)` (called on the engine's reader thread) gets each
        AudioChunk and then None; without one, items go to the tracked request's queue."""
        if self.closed:
            raise EngineError("engine is closed")
        request.validate()
        with self._lock:
            if request.request_id in self._tracked:
                raise RequestError(f"request id {request.request_id!r} is already in flight", "request_id")
            t = Tracked(request, time.monotonic(), listener=listener)
            self._tracked[request.request_id] = t
        self.in_q.put(Add(request))
        return t

    def abort(self, request_id: str) -> None:
        if not self.closed:
            self.in_q.put(Abort(request_id))
        self._fail(request_id, Diagnosis(kind="Aborted", message="Aborted: the request was aborted"))

    @staticmethod
    def _result(t: Tracked) -> SpeechResult:
        audio = np.concatenate(t.chunks) if t.chunks else np.zeros(0, dtype=np.float32)
        codes = t.codes if t.codes is not None else np.zeros((0, CODEBOOKS), dtype=np.int64)
        if t.error is not None:
            status = "aborted" if t.error.kind == "Aborted" else "finished_error"
        else:
            status = t.reason
        return SpeechResult(t.request.request_id, audio, SAMPLE_RATE, codes, status, dict(t.timings), t.error)

    def generate(self, requests: Iterable[SpeechRequest], timeout: float | None = None) -> list[SpeechResult]:
        """Results in input order.  A failed request has status finished_error and its `error` Diagnosis."""
        requests = list(requests)
        for r in requests:
            r.validate()
        ids = [r.request_id for r in requests]
        if len(set(ids)) != len(ids):
            raise RequestError("request ids in one batch must be unique", "request_id")
        tracked = [self.submit(r) for r in requests]
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in tracked:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not t.done.wait(left):
                for u in tracked:
                    self.abort(u.request.request_id)
                raise TimeoutError(f"generate did not finish within {timeout}s")
        return [self._result(t) for t in tracked]

    def stream(self, request: SpeechRequest) -> Iterator[AudioChunk]:
        """Audio chunks as stage 1 decodes them; raises EngineError carrying the diagnosis on failure."""
        t = self.submit(request)
        try:
            while True:
                item = t.events.get()
                if item is None:
                    break
                yield item
            if t.error is not None:
                raise failure(t.error)
        finally:
            if not t.done.is_set():
                self.abort(request.request_id)
