"""Stage 0 on the built-in talker: runner v1 or v2 (model_runner.py) computes one frame per running
request per step, codebook 0 and the code predictor's 15 together."""
from __future__ import annotations

import torch

from engine.models.build import build_models
from engine.models.upload import Download
from engine.stage.loop import device_for
from engine.stage0.backend import Backend, Produced
from engine.stage0.model_runner import Sequence, make_runner


class TorchBackend(Backend):
    def __init__(self, profile):
        cfg, stage = profile.config, profile.stage(0)
        self.device = device_for(profile, stage)
        self.models = build_models(cfg.model.preset, cfg.model.seed, cfg.model.checkpoint, cfg.model.dtype,
                                   str(self.device), parts=("talker",))
        self.runner = make_runner(cfg.model_runner, self.models, stage, self.device, not stage.enforce_eager,
                                  stage.max_model_len)
        self.name, self.capacity, self.synthetic = self.runner.name, self.runner.capacity, self.models.synthetic
        self.in_flight: Launched | None = None

    def info(self) -> dict:
        pool = getattr(self.runner, "pool", None)
        return {"backend": "torch", "runner": self.runner.name, "graphs": bool(self.runner.capture_sizes),
                "captured": sorted({bs for bs, _ in pool.graphs}) if pool else [],
                "kv_positions": self.runner.capacity}

    def admit(self, seqs: list[Sequence]) -> None:
        """They decode their first frame in this step's batch."""
        for seq in seqs:
            self.runner.add(seq)
        self.runner.prefill(seqs)

    @torch.no_grad()
    def execute(self, seqs: list[Sequence], clock) -> dict[str, Produced]:
        """Launches this step, then reads back the step before it: the host's work on one step's frames (and
        the talker's handoff and inbox after it) runs while the device computes the next.  A forced stop is
        known at launch; a stop the model chose is read a step late, and that step's frame is dropped."""
        in_flight, self.in_flight = self.in_flight, None
        with clock.part("decode"):
            launch = [s for s in seqs if not s.sampler.spent()]   # its last frame is in flight
            if launch:
                self.in_flight = Launched(launch, self.runner.decode(launch))
        with clock.part("readback"):
            return in_flight.read() if in_flight else {}

    def release(self, seq: Sequence) -> None:
        self.runner.release(seq)


class Launched:
    """A launched frame step: its rows, and their codes on their way to the host."""

    def __init__(self, seqs: list[Sequence], codes: torch.Tensor):
        self.seqs = seqs
        self.codes = Download(codes)

    def read(self) -> dict[str, Produced]:
        """Each row's frame, for the requests still running (one released meanwhile is not).  The frames are
        copied out of the step's pinned block: a row view would keep the block alive as long as its request
        runs, and every step would take a new block from the pinned allocator."""
        out = {}
        for seq, frame in zip(self.seqs, self.codes.wait().numpy().copy()):
            if seq.slot is None:
                continue
            sampler = seq.sampler
            finished = sampler.emitted(sampler.params.stops[0] if sampler.must_stop() else int(frame[0]))
            out[seq.request_id] = Produced([] if finished else [frame], finished)
        return out
