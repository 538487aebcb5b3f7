"""Stage 1 process: code2wav.  Decodes each handed-off window with left context.

A window [start, end) is decoded together with up to codec_left_context_frames
frames before it, and only the new frames' samples are emitted.  Because the
decoder's receptive field fits in that context, the stream equals a whole-payload
decode.
"""
from __future__ import annotations

import os
import time

import numpy as np
import torch

from engine.models import build_models
from engine.presets import SAMPLES_PER_FRAME
from engine.messages import Abort, Decoded, Frames, Ready, Stop
from engine.request import AudioChunk
from engine.faults import Injector
from engine.stage_loop import Heart, device_for, drain, fatal, request_crashed, setup_torch, stall_forever


class Code2Wav:
    def __init__(self, profile, out_q, faults=()):
        cfg = profile.config
        self.faults = Injector(list(faults), 1)
        self.finished = self.frames = self.windows = 0
        self.busy = False
        self.stage = profile.stage(1)
        self.device = device_for(profile, self.stage)
        self.codec = build_models(cfg.model.preset, cfg.model.seed, cfg.model.checkpoint, cfg.model.dtype,
                                  str(self.device), parts=("codec",)).codec
        self.left_context = profile.connector().codec_left_context_frames
        if self.codec.shape.receptive_field > self.left_context:
            print(f"code2wav: left context {self.left_context} < receptive field "
                  f"{self.codec.shape.receptive_field}; chunk edges will differ from a whole decode", flush=True)
        self.out_q = out_q
        self.codes: dict[str, np.ndarray] = {}
        self.chunks: dict[str, int] = {}
        self.first_seen: dict[str, float] = {}
        self.failed: set[str] = set()   # requests whose decode raised: their later windows are dropped

    def stats(self) -> dict:
        return {"depth": len(self.first_seen), "busy": self.busy, "windows": self.windows}

    @torch.no_grad()
    def decode(self, window: Frames) -> None:
        """One window.  If it raises, that request fails with the traceback and the stage goes on."""
        self.busy = True
        try:
            if window.request_id in self.failed:
                if window.final:
                    self.failed.discard(window.request_id)
                return
            self.faults.raise_at(window.start + len(window.codes), window.request_id)
            self._decode(window)
        except Exception:
            request_crashed(self.out_q, 1, [window.request_id])
            self.abort(window.request_id)
            if not window.final:
                self.failed.add(window.request_id)
        finally:
            self.busy = False
            self.windows += 1
            self.frames += len(window.codes)

    def _decode(self, window: Frames) -> None:
        rid = window.request_id
        self.first_seen.setdefault(rid, time.monotonic())
        have = self.codes.get(rid, np.zeros((0, window.codes.shape[1]), dtype=np.int64))
        codes = np.concatenate((have[:window.start], window.codes))
        ctx = max(0, window.start - self.left_context)
        if len(window.codes):
            batch = torch.as_tensor(codes[ctx:], device=self.device)[None]
            audio = self.codec(batch, first_position=ctx)[0, (window.start - ctx) * SAMPLES_PER_FRAME:]
            audio = audio.float().cpu().numpy()
        else:
            audio = np.zeros(0, dtype=np.float32)
        index = self.chunks.get(rid, 0)
        if window.final:  # timing first: the final chunk completes the request on the other side
            self.finished += 1
            self.codes.pop(rid, None)
            self.chunks.pop(rid, None)
            self.out_q.put(Decoded(rid, time.monotonic() - self.first_seen.pop(rid)))
        self.out_q.put(AudioChunk(rid, index, audio, window.final))
        if not window.final:
            self.codes[rid] = codes
            self.chunks[rid] = index + 1

    def abort(self, request_id: str) -> None:
        self.failed.discard(request_id)
        self.codes.pop(request_id, None)
        self.chunks.pop(request_id, None)
        self.first_seen.pop(request_id, None)


def run(profile, queues, parent_pid: int, faults=()) -> None:
    _, handoff_q, out_q = queues
    setup_torch()
    try:
        worker = Code2Wav(profile, out_q, faults)
        out_q.put(Ready(1))
        Heart(out_q, 1, profile.config.watchdog.heartbeat_interval_s, worker.stats, parent_pid).start()
        while True:
            for msg in drain(handoff_q, block=True, parent_pid=parent_pid):
                if worker.faults.stalled(worker.windows):
                    stall_forever()
                match msg:
                    case Frames():
                        worker.decode(msg)
                        if worker.faults.should_die(worker.finished, worker.frames):
                            os._exit(1)
                    case Abort(request_id):
                        worker.abort(request_id)
                    case Stop():
                        return
    except SystemExit:
        raise
    except BaseException:
        fatal(out_q, 1)
        raise
