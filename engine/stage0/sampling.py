"""Sampling as Qwen3-TTS does it: repetition penalty, temperature, top-k, top-p.

Each request owns a torch.Generator seeded from its seed and takes the 16 uniforms of
a frame (codebook 0, then 1..15) from it, on the host, before the frame step.  It draws
them DRAWN_FRAMES frames at a time: the same numbers as a draw per frame (the generator's
stream does not depend on how it is cut), for one call where a frame step at C64 made 64.
A request's tokens therefore never depend on what else is in the batch, on the
runner, or on graph mode.  Everything after the draw runs on the device from per-slot
tensors, with no host sync, so a whole frame step can sit in one CUDA graph.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from engine.models import kernels
from engine.models.graphs import capturing
from engine.models.presets import CODEBOOK_SIZE, CODEBOOKS, CODEC_VOCAB, CODEC_EOS
from engine.models.upload import upload

DRAWN_FRAMES = 64


@dataclass
class SamplingParams:
    temperature: float
    top_k: int
    top_p: float
    repetition_penalty: float
    min_tokens: int
    max_tokens: int
    stop_token_ids: tuple[int, ...]
    seed: int
    target_frames: int | None = None   # synthetic weights: stop exactly here

    @property
    def stops(self) -> tuple[int, ...]:
        """The tokens that end a request: the configured ones, else the codec's EOS."""
        return tuple(self.stop_token_ids) or (CODEC_EOS,)

    @classmethod
    def for_request(cls, req, defaults, target_frames: int | None) -> "SamplingParams":
        pick = lambda name: getattr(req, name) if getattr(req, name) is not None else getattr(defaults, name)
        max_tokens = req.max_new_tokens if req.max_new_tokens is not None else defaults.max_tokens
        return cls(temperature=pick("temperature"), top_k=pick("top_k"), top_p=pick("top_p"),
                   repetition_penalty=pick("repetition_penalty"), min_tokens=defaults.min_tokens,
                   max_tokens=max_tokens, stop_token_ids=tuple(defaults.stop_token_ids), seed=req.seed,
                   target_frames=target_frames)


def sample(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
           u: torch.Tensor, kmax: int | None = None, nucleus: bool = True) -> torch.Tensor:
    """One token per row.  A row with temperature 0 takes the argmax; the others keep their top-k and
    top-p nucleus and draw by inverse CDF with their own uniform u.  Shapes stay fixed and nothing
    is read back to the host, so this runs inside a CUDA graph.

    Uncaptured, the caller may say what the rows need: `kmax`, the largest top-k among them, and
    `nucleus=False` when none has top_p < 1.  Then a top-kmax replaces the full sort and the nucleus
    step is skipped, for the same tokens."""
    x = logits.float()
    greedy = x.argmax(-1)
    vocab = x.shape[-1]
    x = x / temperature.clamp(min=1e-5)[:, None]
    k = torch.where((top_k > 0) & (top_k < vocab), top_k, vocab)
    if nucleus or kmax is None:
        ordered, order = x.sort(-1, descending=True)
    else:
        ordered = x.topk(min(kmax, vocab), -1).values
    x = x.masked_fill(x < ordered.gather(1, (k - 1).clamp(max=ordered.shape[1] - 1)[:, None]), float("-inf"))
    probs = x.softmax(-1)
    if nucleus:
        ordered_p = probs.gather(1, order)
        drop = ((ordered_p.cumsum(-1) - ordered_p) > top_p[:, None]) & (top_p < 1.0)[:, None]
        probs = torch.zeros_like(probs).scatter(1, order, ordered_p.masked_fill(drop, 0.0))
    cdf = probs.cumsum(-1)
    picked = torch.searchsorted(cdf, u[:, None] * cdf[:, -1:], right=True).clamp(max=vocab - 1)[:, 0]
    return torch.where(temperature > 0, picked, greedy)


class RequestSampler:
    """The host side of one request's sampling: its generator and how many frames it has emitted."""

    def __init__(self, params: SamplingParams):
        self.params = params
        self.gen = torch.Generator().manual_seed(params.seed)
        self.frames = 0     # frames read back and emitted
        self.launched = 0   # frame steps launched: ahead of `frames` by the one in flight, if any
        self.drawn = np.zeros((0, CODEBOOKS), dtype=np.float32)   # uniforms drawn and not yet taken

    def _forced(self, frames: int) -> bool:
        p = self.params
        return frames >= p.max_tokens or (p.target_frames is not None and frames >= p.target_frames)

    def must_stop(self) -> bool:
        """The request ends now, whatever the model says: max_tokens, or the synthetic length, reached."""
        return self._forced(self.frames)

    def spent(self) -> bool:
        """Its forced stop is already launched: no further frame step can make it anything."""
        return self.launched > 0 and self._forced(self.launched - 1)

    def may_stop(self) -> bool:
        """Whether the model may choose a stop token in the frame launched next."""
        return self.launched >= self.params.min_tokens and self.params.target_frames is None

    def uniforms(self) -> np.ndarray | None:
        """The 16 draws of the frame being launched, or None when it draws nothing (greedy, or a forced
        stop).  A frame's launch counts here: a step may be launched before the one ahead of it is read back,
        and what a frame may do (stop, draw) follows from the frames launched before it, not those read."""
        self.launched += 1
        if self.params.temperature <= 0 or self._forced(self.launched - 1):
            return None
        if not len(self.drawn):
            self.drawn = torch.rand(DRAWN_FRAMES, CODEBOOKS, generator=self.gen).numpy()
        u, self.drawn = self.drawn[0], self.drawn[1:]
        return u

    def emitted(self, token: int) -> bool:
        """Record this frame's codebook-0 token (the forced stop already applied); True if it ends the request."""
        if token in self.params.stops:
            return True
        self.frames += 1
        return False


class SlotSampling:
    """Per-slot sampling state on the device: parameters, the codebook-0 mask, the tokens a request has
    emitted (for its repetition penalty) and this frame's uniforms.  The host writes a slot's row
    when a request is admitted and the uniforms before each step; the device does the rest."""

    def __init__(self, slots: int, device: torch.device):
        self.device = device
        self.temperature = torch.zeros(slots, device=device)
        self.top_k = torch.zeros(slots, dtype=torch.long, device=device)
        self.top_p = torch.ones(slots, device=device)
        self.penalty = torch.ones(slots, device=device)
        self.bias = torch.zeros(slots, CODEC_VOCAB, device=device)          # 0 allowed, -inf not
        self.seen = torch.zeros(slots, CODEC_VOCAB, dtype=torch.bool, device=device)
        self.u = torch.zeros(slots, CODEBOOKS, device=device)
        pin = device.type == "cuda"
        self.host_u = torch.zeros(slots, CODEBOOKS, pin_memory=pin)
        self.host_u_rows = self.host_u.numpy()   # the same memory: a row written here costs no torch call
        self.may_stop: dict[int, bool] = {}
        self.host: dict[int, tuple[int, float]] = {}   # slot -> (top_k, top_p) of the request in it
        self.max_k: int | None = 1      # the largest top-k admitted, None for the whole vocabulary
        self.nucleus = False            # whether any admitted request has top_p < 1
        self.true = torch.ones((), dtype=torch.bool, device=device)

    def admit(self, slot: int, sampler: RequestSampler) -> None:
        """A slot's row is written with `fill_`: `t[slot] = number` on a CUDA tensor is a blocking copy, which
        waits for the frame step in flight; a fill is a kernel queued behind it."""
        p = sampler.params
        for row, value in ((self.temperature, p.temperature), (self.top_k, p.top_k), (self.top_p, p.top_p),
                           (self.penalty, p.repetition_penalty), (self.seen, False)):
            row[slot].fill_(value)
        self.host[slot] = (p.top_k, p.top_p) if p.temperature > 0 else (1, 1.0)
        self._needs()
        self._set_stops(slot, sampler)

    def release(self, slot: int) -> None:
        self.temperature[slot].fill_(0.0)
        self.may_stop.pop(slot, None)
        self.host.pop(slot, None)
        self._needs()

    def _needs(self) -> None:
        """What the admitted requests need of an uncaptured draw; it changes only on admit and release."""
        ks = [k for k, _ in self.host.values()]
        self.max_k = None if any(k <= 0 for k in ks) else max(ks, default=1)
        self.nucleus = any(p < 1.0 for _, p in self.host.values())

    def _set_stops(self, slot: int, sampler: RequestSampler) -> None:
        bias = torch.full((CODEC_VOCAB,), float("-inf"))
        bias[:CODEBOOK_SIZE] = 0.0
        stops = list(sampler.params.stops)
        bias[stops] = 0.0 if sampler.may_stop() else float("-inf")
        self.bias[slot] = upload(bias, self.device)
        self.may_stop[slot] = sampler.may_stop()

    def prepare(self, slots: list[int], samplers: list[RequestSampler]) -> None:
        """Before a step: each row's uniforms, and its stop tokens unmasked once min_tokens is reached."""
        for slot, sampler in zip(slots, samplers):
            if sampler.may_stop() != self.may_stop.get(slot):
                self._set_stops(slot, sampler)
            u = sampler.uniforms()
            if u is not None:
                self.host_u_rows[slot] = u
        self.u.copy_(self.host_u, non_blocking=True)

    def first(self, logits: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Codebook 0 for these slots: only codebook ids and allowed stops, repeats penalized."""
        x = logits.float() + self.bias[rows]
        pen = self.penalty[rows][:, None]
        x = torch.where(self.seen[rows], torch.where(x > 0, x / pen, x * pen), x)
        token = self.draw(x, rows, 0)
        self.seen.index_put_((rows, token), self.true)
        return token

    def draw(self, logits: torch.Tensor, rows: torch.Tensor, codebook: int,
             embed: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """A token for each row; with embed (table, into), each token's table row is written to into, where
        the next code-predictor pass reads its input (the fused kernel does both at once)."""
        if kernels.use(logits):   # one kernel, no sort, for any mix of requests: captured or not
            return kernels.sample(logits, rows, self.temperature, self.top_k, self.top_p, self.u, codebook, embed)
        hints = {}
        if not capturing():   # eager: only what the admitted requests need (a graph must serve any of them)
            vocab = logits.shape[-1]
            hints = {"kmax": vocab if self.max_k is None else min(self.max_k, vocab), "nucleus": self.nucleus}
        token = sample(logits, self.temperature[rows], self.top_k[rows], self.top_p[rows], self.u[rows, codebook],
                       **hints)
        if embed is not None:
            table, into = embed
            into.copy_(table[token])
        return token
