"""Stage 0 in its process: requests in, frames out to stage 1, codes back to the engine.

One step: the scheduler admits waiting requests, the backend computes one step for the running batch,
and each request's new frames go to the handoff; a finished request's codes go back to the engine.
"""
from __future__ import annotations

import time
from contextlib import contextmanager

import numpy as np
import torch

from engine.models.presets import CODEBOOKS, SAMPLE_RATE, SAMPLES_PER_FRAME
from engine.models.tokenizer import frames_for_text
from engine.stage.faults import Injector
from engine.stage.loop import Clock, request_crashed
from engine.stage.messages import Codes, StageError
from engine.stage.stats import TalkerStats
from engine.stage0.backend import Backend
from engine.stage0.handoff import HandoffPolicy, Sender
from engine.stage0.kv_budget import CapacityError
from engine.stage0.model_runner import Sequence
from engine.stage0.sampling import RequestSampler, SamplingParams
from engine.stage0.scheduler import Scheduler


class Talker:
    def __init__(self, profile, backend: Backend, handoff_q, out_q, faults=()):
        self.stage, self.backend, self.out_q = profile.stage(0), backend, out_q
        self.faults = Injector(list(faults), 0)
        self.scheduler = Scheduler(self.stage.max_num_seqs, self.stage.max_num_batched_tokens,
                                   backend.in_flight_tokens)
        self.sender = Sender(HandoffPolicy(profile.config.async_chunk, profile.connector()), handoff_q, self.faults)
        self.started: dict[str, float] = {}
        self.steps = self.finished = 0
        self.stepping: list[Sequence] = []   # the requests the current step is working on
        # admit: new requests' prefills; decode: the step itself; readback: waiting for its codes and reading
        # them; handoff: windows to stage 1 and finished requests; inbox: the engine's messages (new requests'
        # prompts, aborts) taken between steps while requests run
        self.clock = Clock("decode", "admit", "readback", "handoff", "inbox")

    def close(self) -> None:
        self.backend.close()

    @property
    def busy(self) -> bool:
        return self.scheduler.busy

    def longest(self) -> int:
        """Frames of the furthest running request (what `kill_stage:after_frames` counts)."""
        return max((len(s.frames) for s in self.scheduler.running), default=0)

    def add(self, req) -> None:
        backend = self.backend
        target = frames_for_text(req.text) if backend.synthetic else None
        params = SamplingParams.for_request(req, self.stage.default_sampling_params, target)
        seq = Sequence(req, RequestSampler(params), backend.models.talker.prompt_embeds(req))
        reason = self._too_long(seq, params, target) or backend.refusal(seq)
        if reason:
            self.out_q.put(StageError(req.request_id, 0, reason))
            return
        self.started[req.request_id] = time.monotonic()
        self.scheduler.add(seq)

    def _too_long(self, seq: Sequence, params: SamplingParams, target: int | None) -> str | None:
        prompt, capacity, max_len = seq.prompt.shape[0], self.backend.capacity, self.stage.max_model_len
        longest = prompt + min(params.max_tokens, target or params.max_tokens) + 1
        if longest <= capacity:
            return None
        limit = f"stages.0.max_model_len={max_len}" if capacity == max_len else \
            f"the {capacity} positions of KV cache each of stages.0.max_num_seqs={self.stage.max_num_seqs} gets " \
            f"within stages.0.gpu_memory_utilization={self.stage.gpu_memory_utilization} " \
            f"(stages.0.max_model_len={max_len})"
        return f"prompt of {prompt} positions plus up to {longest - prompt} frames exceeds {limit}"

    @contextmanager
    def isolated(self, request_id: str):
        """An exception while handling this one request fails it, with the traceback, and nothing else."""
        try:
            yield
        except CapacityError:
            raise
        except Exception:
            request_crashed(self.out_q, 0, [request_id])
            self.abort(request_id)

    def abort(self, request_id: str) -> None:
        for seq in self.scheduler.remove(request_id):
            self.backend.release(seq)
        self.started.pop(request_id, None)
        self.sender.forget(request_id, abort=True)

    def fail_step(self) -> None:
        """A batched step raised: fail the requests it was working on; the stage goes on with the rest."""
        hit, self.stepping = self.stepping, []
        request_crashed(self.out_q, 0, [s.request_id for s in hit])
        for seq in hit:
            self.backend.release(seq)   # admitted ones may not be running yet
            self.abort(seq.request_id)

    @torch.no_grad()
    def step(self) -> None:
        self.steps += 1
        self.stepping = list(self.scheduler.running)
        with self.clock.part("admit"):
            admitted = self.scheduler.schedule()
            self.stepping += admitted
            if admitted:
                self.backend.admit(admitted)
        rows = list(self.scheduler.running)
        if not rows:
            return
        produced = self.backend.execute(rows, self.clock)
        with self.clock.part("handoff"):
            for seq in rows:
                out = produced.get(seq.request_id)
                if out is None:
                    continue
                with self.isolated(seq.request_id):
                    seq.frames += out.frames
                    self.sender.send(seq.request_id, seq.frames, out.finished)
                    if out.finished:
                        self._finish(seq)
        self.stepping = []

    def _finish(self, seq: Sequence) -> None:
        rid = seq.request_id
        self.scheduler.finish(seq)
        self.backend.release(seq)
        reason = "finished_length" if len(seq.frames) >= seq.sampler.params.max_tokens else "finished_stopped"
        codes = np.stack(seq.frames) if seq.frames else np.zeros((0, CODEBOOKS), dtype=np.int64)
        elapsed = time.monotonic() - self.started.pop(rid)
        self.sender.forget(rid, abort=False)
        self.finished += 1
        self.out_q.put(Codes(rid, codes, reason, {"stage0_s": elapsed,
                                                  "audio_s": len(codes) * SAMPLES_PER_FRAME / SAMPLE_RATE}))

    def stats(self) -> TalkerStats:
        """Progress for the heartbeat (read from the heartbeat thread: copies only)."""
        running = [(s.request_id, len(s.frames)) for s in list(self.scheduler.running)]
        sent = dict(self.sender.sent)
        return TalkerStats(depth=len(self.scheduler.waiting) + len(running), steps=self.steps,
                           handoffs_begun=self.sender.begun, handoffs_done=self.sender.done,
                           handoff_request=self.sender.request,
                           requests={rid: (n, sent.get(rid, 0)) for rid, n in running},
                           seconds=dict(self.clock.seconds))
