"""The offline engine: spawns the two stage processes and routes requests and audio.

    with TTSEngine(resolve("qwen3_tts")) as engine:
        results = engine.generate([SpeechRequest("Hello.")])

The stages run in spawned processes that form one process group led by stage 0.
`close()` asks them to stop, then kills the whole group, so nothing outlives the
engine even when a stage is wedged.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

import numpy as np
import psutil

from engine.config import ResolvedProfile
from engine.errors import EngineError, RequestFailed, failure  # noqa: F401  (RequestFailed re-exported)
from engine.faults import from_env as faults_from_env, parse as parse_faults
from engine.presets import CODEBOOKS, SAMPLE_RATE, SAMPLES_PER_FRAME
from engine.procs import kill_processes, stage_main
from engine.request import AudioChunk, RequestError, SpeechRequest, SpeechResult
from engine.watchdog import Watchdog

_LIVE: "weakref.WeakSet[TTSEngine]" = weakref.WeakSet()


class _ClosedQueue:
    def put(self, item):
        raise EngineError("engine is closed")

    def get(self, *a, **kw):
        raise EngineError("engine is closed")


def live_engine_pids() -> set[int]:
    """Pids of the stage processes of every engine that is still open (for leak checks)."""
    return {pid for eng in list(_LIVE) for pid in eng.pids()}


@dataclass
class _Tracked:
    request: SpeechRequest
    submitted: float
    events: "queue.Queue" = field(default_factory=queue.Queue)
    chunks: list[np.ndarray] = field(default_factory=list)
    codes: np.ndarray | None = None
    reason: str | None = None
    timings: dict = field(default_factory=dict)
    audio_done: bool = False
    error: dict | None = None
    done: threading.Event = field(default_factory=threading.Event)
    listener: "Callable[[AudioChunk | None], None] | None" = None
    # progress the watchdog reads: frames produced / handed off by stage 0, consumed by stage 1
    produced: int = 0
    handed_off: int = 0
    consumed: int = 0
    stage0_done: bool = False
    pending_since: float | None = None   # since when handed-off frames have been waiting for stage 1

    def progress(self, produced: int | None = None, handed_off: int | None = None, consumed: int = 0) -> None:
        if produced is not None:
            self.produced = max(self.produced, produced)
        if handed_off is not None:
            self.handed_off = max(self.handed_off, handed_off)
        self.consumed += consumed
        if self.handed_off <= self.consumed:
            self.pending_since = None
        elif self.pending_since is None or consumed:
            self.pending_since = time.monotonic()

    def emit(self, item) -> None:
        """An audio chunk, or None at the end, to the stream consumer (a queue or a callback)."""
        (self.listener or self.events.put)(item)


def _kill_group(pgid: int | None, pids: list[int]) -> None:
    """SIGKILL the stage group and any stage (or stage child) that left it."""
    victims = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            victims += [proc] + proc.children(recursive=True)
        except psutil.NoSuchProcess:
            pass
    if pgid:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    kill_processes(victims)


class TTSEngine:
    def __init__(self, profile: ResolvedProfile, start_timeout: float = 300.0):
        self.profile = profile
        self.closed = False
        self.info: dict[int, dict] = {}
        self.beats: dict[int, tuple[float, dict]] = {}
        faults = parse_faults(profile.config.faults, "profile faults") + faults_from_env()
        self.faults = faults
        ctx = mp.get_context("spawn")
        self.in_q, self.handoff_q, self.out_q = ctx.Queue(), ctx.Queue(), ctx.Queue()
        queues = (self.in_q, self.handoff_q, self.out_q)
        self._tracked: dict[str, _Tracked] = {}
        self._lock = threading.Lock()
        self.procs: list[mp.Process] = []
        self.pgid: int | None = None
        me = os.getpid()
        p0 = ctx.Process(target=stage_main, args=(0, None, profile, queues, me, faults), name="lanekeeper-stage0-talker")
        p0.start()
        self.procs.append(p0)
        self.pgid = p0.pid
        p1 = ctx.Process(target=stage_main, args=(1, p0.pid, profile, queues, me, faults), name="lanekeeper-stage1-code2wav")
        p1.start()
        self.procs.append(p1)
        self._finalizer = weakref.finalize(self, _kill_group, self.pgid, [p.pid for p in self.procs])
        _LIVE.add(self)
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
            for stage, proc in enumerate(self.procs):
                if stage not in self.info and not proc.is_alive():
                    raise EngineError(f"stage {stage} ({self.profile.stage_name(stage)}) exited with code {proc.exitcode} "
                                      f"during start-up")
            if time.monotonic() > deadline:
                raise EngineError(f"engine did not start within {timeout:.0f}s")
            try:
                msg = self.out_q.get(timeout=0.2)
            except queue.Empty:
                continue
            if msg[0] == "ready":
                self.info[msg[1]] = msg[2]
                self.beats[msg[1]] = (time.monotonic(), {})   # ready is a stage's first sign of life
            elif msg[0] == "beat":
                self.beats[msg[1]] = (time.monotonic(), msg[2])
            elif msg[0] == "fatal":
                raise EngineError(f"stage {msg[1]} ({self.profile.stage_name(msg[1])}) failed during start-up: {msg[3]}",
                                  detail=msg[2])

    def verdict(self) -> dict | None:
        """Why this engine cannot serve any more (a dead, silent or stuck stage), or None."""
        return self.watchdog.verdict

    def dead_stages(self) -> list[int]:
        return [stage for stage, proc in enumerate(self.procs) if not proc.is_alive()]

    def tracked(self) -> list[_Tracked]:
        with self._lock:
            return list(self._tracked.values())

    def handoff_backlog(self) -> int:
        """Windows sent to stage 1 and not yet taken by it."""
        try:
            return self.handoff_q.qsize()
        except (NotImplementedError, AttributeError, OSError):
            return 0

    def fail_request(self, request_id: str, error: dict) -> None:
        """Fail one request with a diagnosis and drop it from both stages."""
        self._fail(request_id, error)
        if not self.closed:
            try:
                self.in_q.put(("abort", request_id))
            except (EngineError, ValueError, OSError):
                pass

    def queue_depths(self) -> dict[int, int]:
        """Requests each stage holds, from its latest heartbeat."""
        return {stage: stats.get("depth", 0) for stage, (_, stats) in sorted(self.beats.items())}

    def pids(self) -> list[int]:
        """The stage processes and what they started (vLLM's engine core and workers, say)."""
        if self.closed:
            return []
        out = []
        for proc in self.procs:
            if proc.pid is None:
                continue
            out.append(proc.pid)
            try:
                out += [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
            except psutil.Error:
                pass
        return out

    def close(self, timeout: float = 5.0) -> None:
        if self.closed:
            return
        try:
            self.in_q.put(("stop",))
            deadline = time.monotonic() + timeout
            for proc in self.procs:
                proc.join(max(0.0, deadline - time.monotonic()))
        finally:
            self.closed = True
            self._finalizer()          # kills the group whatever state the stages are in
            for proc in self.procs:
                proc.join(1)
            self._fail_all({"kind": "EngineClosed", "message": "engine closed before the request finished"})
            reader = getattr(self, "_reader", None)
            if reader is not None and reader is not threading.current_thread():
                reader.join(2)
            for q in (self.in_q, self.handoff_q, self.out_q):
                q.cancel_join_thread()   # a feeder blocked on a pipe nobody reads must not hold up close...
                q.close()
                feeder = getattr(q, "_thread", None)
                if feeder is not None:   # ...but one that is only finishing gets a moment: it holds the queue's
                    feeder.join(1.0)     # semaphores, and a daemon thread cut off at exit leaks them
            # Drop the queues so their semaphores are released now, not reported as leaked at exit.
            self.in_q = self.handoff_q = self.out_q = _ClosedQueue()
            _LIVE.discard(self)

    def __enter__(self) -> "TTSEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---------------------------------------------------------- output side
    def _read(self) -> None:
        while not self.closed:
            try:
                msg = self.out_q.get(timeout=0.2)
            except (queue.Empty, OSError, ValueError, EOFError, EngineError):
                continue
            self._dispatch(msg)

    def _dispatch(self, msg) -> None:
        if isinstance(msg, AudioChunk):
            t = self._tracked.get(msg.request_id)
            if t is None:
                return
            if not t.chunks and len(msg.audio):
                t.timings["first_audio_s"] = time.monotonic() - t.submitted
            t.progress(consumed=len(msg.audio) // SAMPLES_PER_FRAME)
            t.chunks.append(msg.audio)
            t.emit(msg)
            if msg.final:
                t.audio_done = True
                self._maybe_done(t)
            return
        kind = msg[0]
        if kind == "codes":
            _, rid, codes, reason, timings = msg
            t = self._tracked.get(rid)
            if t:
                t.codes, t.reason, t.stage0_done = codes, reason, True
                t.progress(produced=len(codes), handed_off=len(codes))
                t.timings.update(timings)
                self._maybe_done(t)
        elif kind == "beat":
            self.beats[msg[1]] = (time.monotonic(), msg[2])
            for rid, (produced, handed_off) in msg[2].get("requests", {}).items():
                t = self._tracked.get(rid)
                if t is not None:
                    t.progress(produced=produced, handed_off=handed_off)
        elif kind == "stage1_done":
            t = self._tracked.get(msg[1])
            if t:
                t.timings["stage1_s"] = msg[2]
        elif kind == "error":
            _, rid, stage, message = msg
            self.fail_request(rid, {"kind": "RequestFailed", "stage": stage, "message": message})
        elif kind == "crash":
            _, rid, stage, summary, tb = msg
            name = self.profile.stage_name(stage)
            self.fail_request(rid, {"kind": "StageError", "stage": stage, "stage_name": name,
                                    "message": f"StageError: stage {stage} ({name}) raised {summary} while handling "
                                               f"request {rid}; the stage goes on",
                                    "traceback": tb})
        elif kind == "fatal":
            _, stage, tb, summary = msg
            self._fail_all({"kind": "StageCrashed", "stage": stage, "stage_name": self.profile.stage_name(stage),
                            "message": summary, "traceback": tb})

    def _maybe_done(self, t: _Tracked) -> None:
        if t.codes is not None and t.audio_done:
            t.timings["total_s"] = time.monotonic() - t.submitted
            self._complete(t)

    def _complete(self, t: _Tracked) -> None:
        with self._lock:
            if self._tracked.pop(t.request.request_id, None) is None:
                return
        t.done.set()
        t.emit(None)

    def _fail(self, rid: str, error: dict) -> None:
        t = self._tracked.get(rid)
        if t is None:
            return
        error = {**error, "request_id": rid}
        t.error = error
        self._complete(t)

    def _fail_all(self, error: dict) -> None:
        for rid in list(self._tracked):
            self._fail(rid, error)

    # -------------------------------------------------------------- input side
    def submit(self, request: SpeechRequest, listener=None) -> _Tracked:
        """Queue one request.  `listener(item)` (called on the engine's reader thread) gets each
        AudioChunk and then None; without one, items go to the tracked request's queue."""
        if self.closed:
            raise EngineError("engine is closed")
        request.validate()
        with self._lock:
            if request.request_id in self._tracked:
                raise RequestError(f"request id {request.request_id!r} is already in flight", "request_id")
            t = _Tracked(request, time.monotonic(), listener=listener)
            self._tracked[request.request_id] = t
        self.in_q.put(("add", request))
        return t

    def abort(self, request_id: str) -> None:
        if not self.closed:
            self.in_q.put(("abort", request_id))
        self._fail(request_id, {"kind": "Aborted", "message": "request aborted"})

    @staticmethod
    def _result(t: _Tracked) -> SpeechResult:
        audio = np.concatenate(t.chunks) if t.chunks else np.zeros(0, dtype=np.float32)
        codes = t.codes if t.codes is not None else np.zeros((0, CODEBOOKS), dtype=np.int64)
        if t.error is not None:
            status = "aborted" if t.error.get("kind") == "Aborted" else "finished_error"
        else:
            status = t.reason
        return SpeechResult(t.request.request_id, audio, SAMPLE_RATE, codes, status, dict(t.timings), t.error)

    def generate(self, requests: Iterable[SpeechRequest], timeout: float | None = None) -> list[SpeechResult]:
        """Results in input order.  A failed request has status finished_error and an `error` dict."""
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
