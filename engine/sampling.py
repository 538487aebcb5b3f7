"""Sampling as Qwen3-TTS does it: repetition penalty, temperature, top-k, top-p.

Each request owns a torch.Generator seeded from its seed and draws from it in a
fixed order (codebook 0, then 1..15, every frame).  A request's tokens therefore
never depend on what else is in the batch, on the runner, or on graph mode.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.presets import CODEBOOK_SIZE, CODEC_EOS


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


def sample_rows(logits: torch.Tensor, samplers: list["RequestSampler"]) -> list[int]:
    """One token per row; the filtering is batched, each draw uses its row's generator."""
    logits = logits.float()
    out = logits.argmax(-1).tolist()
    hot = [b for b, s in enumerate(samplers) if s.params.temperature > 0]
    if not hot:
        return out
    rows = torch.tensor(hot, device=logits.device)
    sel = [samplers[b].params for b in hot]
    x = logits[rows] / torch.tensor([p.temperature for p in sel], device=logits.device)[:, None]
    vocab = x.shape[-1]
    ks = torch.tensor([p.top_k if 0 < p.top_k < vocab else vocab for p in sel], device=x.device)
    if int(ks.min()) < vocab:
        top = torch.topk(x, int(ks.max()), dim=-1).values
        kth = top.gather(1, (ks - 1)[:, None].clamp(max=top.shape[1] - 1))
        kth = torch.where(ks[:, None] >= vocab, torch.full_like(kth, float("-inf")), kth)
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, -1)
    top_p = torch.tensor([p.top_p for p in sel], device=x.device)
    if float(top_p.min()) < 1.0:
        sorted_p, idx = probs.sort(-1, descending=True)
        drop = (sorted_p.cumsum(-1) - sorted_p) > top_p[:, None]
        probs = torch.zeros_like(probs).scatter(-1, idx, sorted_p.masked_fill(drop, 0.0))
    # Inverse-CDF draw: one uniform per row from that row's own generator.
    u = torch.cat([torch.rand(1, generator=samplers[b].gen) for b in hot]).to(probs.device)
    cdf = probs.cumsum(-1)
    picked = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).clamp(max=vocab - 1)[:, 0].tolist()
    for b, token in zip(hot, picked):
        out[b] = token
    return out


class RequestSampler:
    """Sampling state of one request: its generator and the codebook-0 tokens it has emitted."""

    def __init__(self, params: SamplingParams):
        self.params = params
        self.gen = torch.Generator().manual_seed(params.seed)
        self.history: list[int] = []

    def process_first(self, logits: torch.Tensor) -> torch.Tensor | int:
        """Codebook-0 logits after masks and penalty, or the stop token when the request must end now."""
        p = self.params
        step = len(self.history)
        stops = list(p.stops)
        if step >= p.max_tokens or (p.target_frames is not None and step >= p.target_frames):
            return stops[0]
        logits = logits.float().clone()
        allowed = torch.full_like(logits, float("-inf"))
        allowed[:CODEBOOK_SIZE] = 0
        allowed[stops] = 0
        logits = logits + allowed
        if p.repetition_penalty != 1.0 and self.history:
            seen = torch.tensor(sorted(set(self.history)), device=logits.device)
            vals = logits[seen]
            logits[seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
        if step < p.min_tokens or p.target_frames is not None:
            logits[stops] = float("-inf")
        return logits


def sample_first(logits: torch.Tensor, samplers: list[RequestSampler]) -> list[int]:
    """Codebook 0 (or a stop token) for each row."""
    processed = [s.process_first(logits[b]) for b, s in enumerate(samplers)]
    live = [b for b, x in enumerate(processed) if not isinstance(x, int)]
    out = [x if isinstance(x, int) else -1 for x in processed]
    if live:
        tokens = sample_rows(torch.stack([processed[b] for b in live]), [samplers[b] for b in live])
        for b, t in zip(live, tokens):
            out[b] = t
    stops = set(samplers[0].params.stops) if samplers else set()
    for b, t in enumerate(out):
        if t not in stops:
            samplers[b].history.append(t)
    return out
