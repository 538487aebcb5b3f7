"""Stage 1: code2wav.  Decodes handed-off windows with left context.

A window [start, end) is decoded together with up to codec_left_context_frames
frames before it, and only the new frames' samples are emitted.  Where the
decoder's receptive field fits in that context, the stream equals a whole-payload
decode.  The windows waiting in the inbox are decoded in a few batched passes, not
one pass each (passes.py cuts them): with many streams, that is what keeps stage 1
up with stage 0.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from engine.models.graphs import GraphPool, padded
from engine.models.build import build_models
from engine.models.presets import CODEBOOKS, SAMPLES_PER_FRAME
from engine.models.upload import upload
from engine.request import AudioChunk
from engine.stage1.passes import Launched, plan
from engine.stage.faults import Injector
from engine.stage.loop import Clock, device_for, request_crashed
from engine.stage.messages import Decoded, Frames
from engine.stage.stats import Code2WavStats


MAX_ROWS = 32                      # windows in one codec pass
# on CUDA, passes are captured for these row counts (a pass of n windows runs the smallest that holds n)...
ROWS = [1, 2, 3, 4, 6, 8, 12, 16, 24, MAX_ROWS]
# ...and frame lengths: powers of two, so no window longer than 16 frames pads to more than twice its
# length, and the lengths of a stream's windows (stream_windows).  Each length costs start-up (about 2 s
# for each row count on an H100, warm-up and cuDNN's algorithm timing included), so the powers of two
# start at 32: the benchmark's texts' windows, each run alone, decode 7 % more frames than they hold,
# against 21 % with 8, 16, 32, 48, 64, 80, 97 and 128
BUCKETS = [32, 64, 128]
# a stream's window lengths are captured while they are this few (a short chunk makes many)
MAX_STREAM_LENGTHS = 8
# an eager pass's fixed part, in row-frames: the `tiny` codec on the CPU takes about 9 ms a pass and
# 1.7 ms a row-frame
EAGER_PASS_FRAMES = 5


def stream_windows(connector) -> list[int]:
    """The lengths, context included, of a stream's windows before its last: its first window, then a
    chunk with the frames before it as context, growing to the full context (the steady length)."""
    initial, chunk, context = (connector.initial_codec_chunk_frames, connector.codec_chunk_frames,
                               connector.codec_left_context_frames)
    lengths, start = [initial], initial
    while lengths[-1] < context + chunk:
        lengths.append(min(start, context) + chunk)
        start += chunk
    return lengths


def pass_lengths(connector) -> list[int]:
    """The frame lengths codec passes are captured at: BUCKETS, and the window lengths a stream makes,
    or only its steady one where those are many; none past BUCKETS' last."""
    stream = stream_windows(connector)
    if len(stream) > MAX_STREAM_LENGTHS:
        stream = stream[-1:]
    return sorted({*BUCKETS, *(t for t in stream if t < BUCKETS[-1])})


@dataclass
class Job:
    """One window to decode: its frames with their left context, where that context starts, its chunk index."""
    window: Frames
    codes: np.ndarray
    context_start: int
    index: int


class Code2Wav:
    def __init__(self, profile, out_q, faults=()):
        cfg = profile.config
        self.faults = Injector(list(faults), 1)
        self.finished = self.frames = self.windows = 0
        self.passes = 0   # codec passes: windows / passes is how well stage 1 batches
        self.window_frames = self.pass_frames = 0   # the windows' frames, and what their passes ran
        self.replay_s = 0.0   # the captured passes run, at the device time each took alone
        self.busy = False
        self.clock = Clock("decode", "readback")
        self.stage = profile.stage(1)
        self.device = device_for(profile, self.stage)
        self.codec = build_models(cfg.model.preset, cfg.model.seed, cfg.model.checkpoint, cfg.model.dtype,
                                  str(self.device), parts=("codec",)).codec
        connector = profile.connector()
        self.left_context = connector.codec_left_context_frames
        self.lengths = pass_lengths(connector)
        if self.codec.shape.receptive_field > self.left_context:
            print(f"code2wav: left context {self.left_context} < receptive field "
                  f"{self.codec.shape.receptive_field}; chunk edges will differ from a whole decode", flush=True)
        self.pool = None
        if self.device.type == "cuda" and not profile.stage(0).enforce_eager:   # the engine's graph mode
            # the codec's convolutions run at a few fixed shapes, each warmed up before its capture: cuDNN
            # may time its algorithms for them once (this process runs nothing else)
            torch.backends.cudnn.benchmark = True
            self.codes_in = torch.zeros(ROWS[-1], self.lengths[-1], CODEBOOKS, dtype=torch.long, device=self.device)
            self.first_in = torch.zeros(ROWS[-1], dtype=torch.long, device=self.device)
            self.pool = GraphPool(lambda rows, t: self.codec(self.codes_in[:rows, :t], first_position=self.first_in[:rows]),
                                  [(rows, t) for rows in ROWS for t in self.lengths], self.device)
            self.replay_times = self.pool.replay_seconds()   # what the pass planner weighs
        self.out_q = out_q
        self.codes: dict[str, np.ndarray] = {}
        self.chunks: dict[str, int] = {}
        self.first_seen: dict[str, float] = {}
        self.failed: set[str] = set()   # requests whose decode raised: their later windows are dropped

    def open_streams(self) -> set[str]:
        """Requests whose later windows are still to come."""
        return set(self.codes)

    def stats(self) -> Code2WavStats:
        return Code2WavStats(depth=len(self.first_seen), busy=self.busy, windows=self.windows, passes=self.passes,
                             window_frames=self.window_frames, pass_frames=self.pass_frames, replay_s=self.replay_s,
                             seconds=dict(self.clock.seconds))

    @torch.no_grad()
    def decode(self, windows: list[Frames], after_each=lambda: None) -> None:
        """Windows in arrival order, decoded together: a few codec passes instead of one per window.
        A window's audio goes out as soon as its pass is done (the shortest windows, which start
        requests, are in the first pass), each request's chunks still in order; `after_each` runs
        after each window's, and a window whose handling raises fails its request alone (the batched
        pass raising fails the requests in it)."""
        if not windows:
            return
        self.busy = True
        try:
            with self.clock.part("decode"):
                waiting = [(w, self._job(w)) for w in windows]
                audio: dict[int, np.ndarray | None] = {}
                waiting = self._emit_ready(waiting, audio, after_each)   # windows with nothing to decode
                for done in self._decode_jobs([j for _, j in waiting if j is not None]):
                    audio.update(done)
                    waiting = self._emit_ready(waiting, audio, after_each)
        finally:
            self.busy = False

    def _emit_ready(self, waiting: list[tuple[Frames, "Job | None"]], audio: dict, after_each) -> list:
        """Emit each waiting window whose audio is in, unless an earlier window of its request is
        still out; return the rest, in order."""
        held, rest = set(), []
        for window, job in waiting:
            ready = job is None or not len(window.codes) or id(job) in audio
            if window.request_id in held or not ready:
                held.add(window.request_id)
                rest.append((window, job))
                continue
            if job is not None:
                self._emit(job, audio.get(id(job)))
            self.windows += 1
            self.frames += len(window.codes)
            after_each()
        return rest

    def _job(self, window: Frames) -> "Job | None":
        """What decoding this window needs, with the request's state moved on; None if it is not decoded."""
        rid = window.request_id
        try:
            if rid in self.failed:
                if window.final:
                    self.failed.discard(rid)
                return None
            self.faults.raise_at(window.start + len(window.codes), rid)
            self.first_seen.setdefault(rid, time.monotonic())
            have = self.codes.get(rid, np.zeros((0, window.codes.shape[1]), dtype=np.int64))
            codes = np.concatenate((have[:window.start], window.codes))
            index = self.chunks.get(rid, 0)
            if window.final:
                self.codes.pop(rid, None)
                self.chunks.pop(rid, None)
            else:
                self.codes[rid] = codes
                self.chunks[rid] = index + 1
            context_start = max(0, window.start - self.left_context)
            return Job(window, codes[context_start:], context_start, index)
        except Exception:
            self._fail(window)
            return None

    def _decode_jobs(self, jobs: list["Job"]):
        """Each pass's audio of its jobs' new frames, pass by pass, as `plan` cuts them: right-padded
        (the codec is causal, so padding after a row's end changes none of its samples).  A pass is
        launched before the one ahead of it is read back: on CUDA, building and launching the next pass
        runs while the device computes this one."""
        todo = sorted((j for j in jobs if len(j.window.codes)), key=lambda j: len(j.codes))
        ahead = None
        for cut in plan([len(j.codes) for j in todo], self._pass_cost, MAX_ROWS):
            group = todo[cut.start:cut.stop]
            try:
                launched = self._launch(group)
            except Exception:
                launched = None
            if ahead is not None:
                yield self._read(ahead)
            if launched is None:
                yield self._failed(group)
            ahead = launched
        if ahead is not None:
            yield self._read(ahead)

    def _launch(self, group: list["Job"]) -> Launched:
        """The pass of these jobs, on its way: the captured pass that holds them replayed (rows padded with
        zeros), or an eager one.  Its inputs go in from pinned memory: a pageable copy would wait for
        the pass ahead."""
        self.passes += 1
        rows, t = self._shape(len(group), len(group[-1].codes))
        pinned = self.device.type == "cuda"
        batch = torch.zeros(rows or len(group), t, CODEBOOKS, dtype=torch.long, pin_memory=pinned)
        first = torch.zeros(len(batch), dtype=torch.long, pin_memory=pinned)
        rows_in, first_at = batch.numpy(), first.numpy()
        for b, job in enumerate(group):
            rows_in[b, :len(job.codes)] = job.codes
            first_at[b] = job.context_start
        if rows:
            self.codes_in[:rows, :t].copy_(batch, non_blocking=True)
            self.first_in[:rows].copy_(first, non_blocking=True)
            audio = self.pool(rows, t)
        else:
            audio = self.codec(upload(batch, self.device), first_position=upload(first, self.device))
        return Launched(group, rows, t, audio[:len(group)].float())

    def _read(self, launched: Launched) -> dict:
        """Its jobs' audio once the device is done, by job; a pass that failed on the device fails them."""
        group, rows, t = launched.group, launched.rows, launched.t
        try:
            with self.clock.part("readback"):   # waiting for the device: the pass, and stage 0's work beside it
                audio = launched.read()
        except Exception:
            return self._failed(group)
        self.window_frames += sum(len(j.codes) for j in group)
        self.pass_frames += (rows or len(group)) * t
        self.replay_s += self.replay_times[(rows, t)] if rows else 0.0
        return {id(job): audio[b, (job.window.start - job.context_start) * SAMPLES_PER_FRAME:
                               len(job.codes) * SAMPLES_PER_FRAME] for b, job in enumerate(group)}

    def _failed(self, group: list["Job"]) -> dict:
        for job in group:
            self._fail(job.window)
        return {id(job): None for job in group}

    def _shape(self, windows: int, longest: int) -> tuple[int | None, int]:
        """The pass these windows run as: (rows, length) of the captured pass that holds them, else
        (None, longest), an eager pass."""
        t = padded(self.lengths, longest) if self.pool else None
        return (padded(ROWS, windows), t) if t else (None, longest)

    def _pass_cost(self, windows: int, longest: int) -> float:
        """A pass's cost: on CUDA the longer of the measured replay of the captured pass it runs as (one longer
        than any captured runs eager, estimated from the longest) and the host time a pass has taken so far,
        else a fixed part and its row-frames.  Passes are pipelined (`_decode_jobs`), so a pass's host work
        hides behind the pass ahead's replay: only where it is the longer does it count, and then joining
        windows into fewer passes saves it."""
        if self.pool is None:
            return EAGER_PASS_FRAMES + windows * longest
        rows, t = self._shape(windows, longest)
        if rows is None:
            replay = self.replay_times[(padded(ROWS, windows), self.lengths[-1])] * longest / self.lengths[-1]
        else:
            replay = self.replay_times[(rows, t)]
        return max(replay, self.clock.seconds["decode"] / self.passes if self.passes else 0.0)

    def _emit(self, job: "Job", audio: np.ndarray | None) -> None:
        window, rid = job.window, job.window.request_id
        if audio is None:
            if len(window.codes) or rid in self.failed:
                return   # its pass raised: the request has failed
            audio = np.zeros(0, dtype=np.float32)
        if window.final:  # timing first: the final chunk completes the request on the other side
            self.finished += 1
            self.out_q.put(Decoded(rid, time.monotonic() - self.first_seen.pop(rid)))
        self.out_q.put(AudioChunk(rid, job.index, audio, window.final))

    def _fail(self, window: Frames) -> None:
        request_crashed(self.out_q, 1, [window.request_id])
        self.abort(window.request_id)
        if not window.final:
            self.failed.add(window.request_id)

    def abort(self, request_id: str) -> None:
        self.failed.discard(request_id)
        self.codes.pop(request_id, None)
        self.chunks.pop(request_id, None)
        self.first_seen.pop(request_id, None)
