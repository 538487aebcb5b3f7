"""Stage 0 on the built-in torch backend: schedule requests, run the talker and code predictor,
hand frames off.

One iteration: admit waiting requests (prefill, within max_num_seqs and the
max_num_batched_tokens prompt budget), decode one frame for every running
request, sample, then hand off whatever windows are due.
"""
from __future__ import annotations

import time
from collections import deque
from contextlib import contextmanager

import numpy as np
import torch

from engine.handoff import HandoffPolicy
from engine.model_runner import CapacityError, Sequence, make_runner
from engine.models import build_models
from engine.presets import CODEBOOKS, SAMPLES_PER_FRAME, SAMPLE_RATE
from engine.sampling import RequestSampler, SamplingParams
from engine.faults import Injector
from engine.messages import Abort, Codes, StageError
from engine.stage_loop import Clock, device_for, request_crashed
from engine.tokenizer import frames_for_text


class TorchTalker:
    def __init__(self, profile, handoff_q, out_q, faults=()):
        cfg = profile.config
        self.faults = Injector(list(faults), 0)
        self.finished = 0
        self.stage = profile.stage(0)
        self.device = device_for(profile, self.stage)
        self.models = build_models(cfg.model.preset, cfg.model.seed, cfg.model.checkpoint, cfg.model.dtype,
                                   str(self.device), parts=("talker",))
        self.max_len = self.stage.max_model_len
        self.runner = self.make_runner(profile)
        self.policy = HandoffPolicy(cfg.async_chunk, profile.connector())
        self.handoff_q, self.out_q = handoff_q, out_q
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.sent: dict[str, int] = {}
        self.started: dict[str, float] = {}
        self.steps = 0
        self.stepping: list[Sequence] = []   # the requests the current step is working on
        # Handoff counters: a window begun and not yet done means stage 0 is inside a handoff, so the
        # watchdog calls a long wait there a handoff stall, not a stalled stage.
        self.handoffs_begun = self.handoffs_done = 0
        self.handoff_request: str | None = None
        # admit: new requests' prefills; decode: every running request's frame, new ones included; readback: waiting
        # for the step's codes; handoff: windows to stage 1 and finished requests
        self.clock = Clock("decode", "admit", "readback", "handoff")

    def make_runner(self, profile):
        return make_runner(profile.config.model_runner, self.models, self.stage, self.device,
                           not self.stage.enforce_eager, self.max_len)

    def info(self) -> dict:
        """What stage 0 reports with its ready message."""
        pool = getattr(self.runner, "pool", None)
        return {"backend": "torch", "runner": self.runner.name, "graphs": bool(self.runner.capture_sizes),
                "captured": sorted({bs for bs, _ in pool.graphs}) if pool else [],
                "kv_positions": self.runner.capacity}

    def close(self) -> None:
        """Nothing to release: the built-in talker lives in this process."""

    @property
    def synthetic(self) -> bool:
        """Weights with no sense of length: a request then stops at its text's length."""
        return self.models.synthetic

    def add(self, req) -> None:
        target = frames_for_text(req.text) if self.synthetic else None
        params = SamplingParams.for_request(req, self.stage.default_sampling_params, target)
        prompt = self.models.talker.prompt_embeds(req)
        longest = prompt.shape[0] + min(params.max_tokens, target or params.max_tokens) + 1
        if longest > self.runner.capacity:
            limit = f"stages.0.max_model_len={self.max_len}" if self.runner.capacity == self.max_len else \
                f"the {self.runner.capacity} positions of KV cache each of stages.0.max_num_seqs=" \
                f"{self.stage.max_num_seqs} gets within stages.0.gpu_memory_utilization=" \
                f"{self.stage.gpu_memory_utilization} (stages.0.max_model_len={self.max_len})"
            self.out_q.put(StageError(req.request_id, 0, f"prompt of {prompt.shape[0]} positions plus up to "
                                                         f"{longest - prompt.shape[0]} frames exceeds {limit}"))
            return
        self.started[req.request_id] = time.monotonic()
        self.waiting.append(Sequence(req, RequestSampler(params), prompt))

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

    def fail_step(self) -> None:
        """A batched step raised: fail the requests it was working on; the stage goes on with the rest."""
        hit, self.stepping = self.stepping, []
        request_crashed(self.out_q, 0, [s.request_id for s in hit])
        for seq in hit:
            self.runner.release(seq)   # admitted ones may not be in `running` yet
            self.abort(seq.request_id)

    def abort(self, request_id: str) -> None:
        for seq in [s for s in self.waiting if s.request_id == request_id]:
            self.waiting.remove(seq)
        for seq in [s for s in self.running if s.request_id == request_id]:
            self.running.remove(seq)
            self.runner.release(seq)
        self.sent.pop(request_id, None)
        self.started.pop(request_id, None)
        self.handoff_q.put(Abort(request_id))

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running)

    @torch.no_grad()
    def step(self) -> None:
        self.steps += 1
        self.stepping = list(self.running)
        with self.clock.part("admit"):
            self._prefill_waiting()
        if not self.running:
            return
        rows = list(self.running)
        with self.clock.part("decode"):
            codes = self.runner.decode(rows)
        with self.clock.part("readback"):
            codes = codes.cpu().numpy()   # the step's one read-back
        with self.clock.part("handoff"):
            for seq, frame in zip(rows, codes):
                with self.isolated(seq.request_id):
                    sampler = seq.sampler
                    finished = sampler.emitted(sampler.params.stops[0] if sampler.must_stop() else int(frame[0]))
                    if not finished:
                        seq.frames.append(frame)
                    self._hand_off(seq, finished)
                    if finished:
                        self._finish(seq)
        self.stepping = []

    def _prefill_waiting(self) -> None:
        """Prefill waiting requests within max_num_seqs and the prompt budget; they decode their first
        frame in this step's batch."""
        budget = self.stage.max_num_batched_tokens
        admitted = []
        while self.waiting and len(self.running) + len(admitted) < self.stage.max_num_seqs:
            seq = self.waiting[0]
            if admitted and seq.prompt.shape[0] > budget:
                break
            self.waiting.popleft()
            self.stepping.append(seq)
            budget -= seq.prompt.shape[0]
            self.runner.add(seq)
            admitted.append(seq)
        if admitted:
            self.runner.prefill(admitted)
        self.running += admitted

    def _hand_off(self, seq: Sequence, finished: bool) -> None:
        rid = seq.request_id
        self.faults.raise_at(len(seq.frames), rid)
        window = self.policy.window(seq.frames, self.sent.get(rid, 0), finished, rid)
        if window is not None:
            end = window.start + len(window.codes)
            if self.faults.drop(end):
                self.sent[rid] = end
                return   # injected: counted as handed off, never delivered
            self.handoff_request = rid
            self.handoffs_begun += 1
            delay = self.faults.delay_s()
            if delay:
                time.sleep(delay)
            self.handoff_q.put(window)
            self.sent[rid] = end   # handed off once delivered: frames still on this side are not stage 1's to wait for
            self.handoffs_done += 1

    def stats(self) -> dict:
        """Progress for the heartbeat: per request, frames produced and handed off."""
        running = [(s.request_id, len(s.frames)) for s in list(self.running)]
        sent = dict(self.sent)
        return {"depth": len(self.waiting) + len(running), "steps": self.steps,
                "handoffs_begun": self.handoffs_begun, "handoffs_done": self.handoffs_done,
                "handoff_request": self.handoff_request,
                "requests": {rid: (n, sent.get(rid, 0)) for rid, n in running},
                "seconds": dict(self.clock.seconds)}

    def _finish(self, seq: Sequence) -> None:
        rid = seq.request_id
        self.running.remove(seq)
        self.runner.release(seq)
        p = seq.sampler.params
        reason = "finished_length" if len(seq.frames) >= p.max_tokens else "finished_stopped"
        codes = np.stack(seq.frames) if seq.frames else np.zeros((0, CODEBOOKS), dtype=np.int64)
        elapsed = time.monotonic() - self.started.pop(rid)
        self.sent.pop(rid, None)
        self.finished += 1
        self.out_q.put(Codes(rid, codes, reason, {"stage0_s": elapsed,
                                                  "audio_s": len(codes) * SAMPLES_PER_FRAME / SAMPLE_RATE}))
