"""Model runners for stage 0.

- `V1Runner` builds the batch anew every step from per-request caches and runs eagerly.
- `V2Runner` keeps a persistent batch: each running request owns a row (slot) of
  preallocated static KV buffers and input buffers.  With CUDA graphs on it pads the
  batch to a captured size and replays the graph; on CPU the same padded static path
  runs without capture, so every cell of the matrix runs in CPU CI.

The code predictor (a fixed 16-position sequence) runs on the static padded path
whenever graphs are on, under either runner.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import numpy as np
import torch

from engine.kv_cache import CausalView, DynamicView, RequestKV, StaticKV
from engine.presets import CODEBOOKS
from engine.sampling import RequestSampler, sample_rows


@dataclass
class Sequence:
    """A request as stage 0 runs it."""
    request: object
    sampler: RequestSampler
    prompt: torch.Tensor                  # [S, hidden]
    num_tokens: int = 0                   # positions written to the KV cache
    frames: list[np.ndarray] = field(default_factory=list)
    next_embed: torch.Tensor | None = None
    slot: int | None = None
    kv: RequestKV | None = None

    @property
    def request_id(self) -> str:
        return self.request.request_id


class GraphPool:
    """Runs `fn(bs)` for padded batch sizes; on CUDA each size is captured once and replayed."""

    def __init__(self, fn, sizes: list[int], device: torch.device):
        self.fn, self.sizes = fn, sorted(sizes)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, object]] = {}
        if device.type == "cuda":
            pool = None
            for bs in reversed(self.sizes):
                fn(bs)  # warm-up on a side stream is what torch.cuda.graph expects first
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    out = fn(bs)
                pool = graph.pool()
                self.graphs[bs] = (graph, out)
            torch.cuda.synchronize()

    def padded(self, n: int) -> int | None:
        i = bisect.bisect_left(self.sizes, n)
        return self.sizes[i] if i < len(self.sizes) else None

    def __call__(self, bs: int):
        if bs in self.graphs:
            graph, out = self.graphs[bs]
            graph.replay()
            return out
        return self.fn(bs)


class ModelRunner:
    def __init__(self, models, stage_cfg, device: torch.device, graphs: bool, max_len: int):
        self.talker, self.cp = models.talker, models.code_predictor
        self.device, self.graphs, self.max_len = device, graphs, max_len
        self.max_seqs = stage_cfg.max_num_seqs
        self.dtype = self.talker.codec_head.weight.dtype
        self.capture_sizes = sorted({min(s, self.max_seqs) for s in stage_cfg.cuda_graph_sizes} | {self.max_seqs}) \
            if graphs else []
        self.cp_pool = None
        if graphs:
            hc = self.cp.in_proj.weight.shape[0]
            self.cp_buf = torch.zeros(self.max_seqs, CODEBOOKS, hc, dtype=self.dtype, device=device)
            cp_pos = torch.arange(CODEBOOKS, device=device)[None]
            self.cp_view = CausalView(cp_pos)
            self.cp_pool = GraphPool(lambda bs: self.cp.hidden(self.cp_buf[:bs], self.cp_view),
                                     self.capture_sizes, device)

    # -- code predictor, shared by both runners
    @torch.no_grad()
    def residual_codes(self, hidden: torch.Tensor, c0: list[int], samplers: list[RequestSampler]) -> np.ndarray:
        b = hidden.shape[0]
        codes = np.zeros((b, CODEBOOKS), dtype=np.int64)
        codes[:, 0] = c0
        tokens = torch.tensor(c0, device=self.device)
        first = self.cp.in_proj(hidden)
        static_bs = self.cp_pool.padded(b) if self.cp_pool else None
        if static_bs:
            self.cp_buf[:b, 0] = first
            self.cp_buf[:b, 1] = self.cp.embed(0, tokens)
        else:
            seq = torch.stack((first, self.cp.embed(0, tokens)), 1)
        for j in range(1, CODEBOOKS):
            if static_bs:
                hid = self.cp_pool(static_bs)[:b, j]
            else:
                hid = self.cp.hidden(seq, CausalView(torch.arange(j + 1, device=self.device)[None]))[:, j]
            picked = sample_rows(self.cp.logits(j, hid), samplers)
            codes[:, j] = picked
            if j < CODEBOOKS - 1:
                emb = self.cp.embed(j, torch.tensor(picked, device=self.device))
                if static_bs:
                    self.cp_buf[:b, j + 1] = emb
                else:
                    seq = torch.cat((seq, emb[:, None]), 1)
        return codes

    def frame_embeds(self, codes: np.ndarray) -> torch.Tensor:
        return self.talker.frame_embeds(torch.as_tensor(codes, device=self.device))


class V1Runner(ModelRunner):
    name = "v1"

    def add(self, seq: Sequence) -> None:
        seq.kv = RequestKV(len(self.talker.decoder.layers))

    def release(self, seq: Sequence) -> None:
        seq.kv = None

    @torch.no_grad()
    def prefill(self, seq: Sequence):
        s = seq.prompt.shape[0]
        positions = torch.arange(s, device=self.device)[None]
        hidden, logits = self.talker(seq.prompt[None], positions, DynamicView([seq.kv], positions))
        seq.num_tokens = s
        return hidden[0, -1], logits[0, -1]

    @torch.no_grad()
    def decode(self, seqs: list[Sequence]):
        embeds = torch.stack([s.next_embed for s in seqs])[:, None]
        positions = torch.tensor([[s.num_tokens] for s in seqs], device=self.device)
        hidden, logits = self.talker(embeds, positions, DynamicView([s.kv for s in seqs], positions))
        for s in seqs:
            s.num_tokens += 1
        return hidden[:, 0], logits[:, 0]


class V2Runner(ModelRunner):
    name = "v2"

    def __init__(self, models, stage_cfg, device, graphs, max_len):
        super().__init__(models, stage_cfg, device, graphs, max_len)
        shape = self.talker.shape
        _check_kv_fits(shape, self.max_seqs, max_len, self.dtype, device, stage_cfg.gpu_memory_utilization)
        self.kv = StaticKV(shape.layers, self.max_seqs, max_len, shape.kv_heads, shape.head_dim, self.dtype, device)
        self.free = list(range(self.max_seqs))
        self.slots: dict[int, Sequence] = {}
        self.in_embeds = torch.zeros(self.max_seqs, 1, shape.hidden, dtype=self.dtype, device=device)
        self.in_pos = torch.zeros(self.max_seqs, 1, dtype=torch.long, device=device)
        self.pool = GraphPool(self._decode_static, self.capture_sizes, device) if graphs else None

    def add(self, seq: Sequence) -> None:
        self.free.sort()
        seq.slot = self.free.pop(0)
        self.slots[seq.slot] = seq

    def release(self, seq: Sequence) -> None:
        if seq.slot is not None:
            del self.slots[seq.slot]
            self.free.append(seq.slot)
            self.in_embeds[seq.slot].zero_()
            self.in_pos[seq.slot].zero_()
            seq.slot = None

    @torch.no_grad()
    def prefill(self, seq: Sequence):
        s = seq.prompt.shape[0]
        positions = torch.arange(s, device=self.device)[None]
        hidden, logits = self.talker(seq.prompt[None], positions, self.kv.view(seq.slot, positions, _bucket(s)))
        seq.num_tokens = s
        return hidden[0, -1], logits[0, -1]

    def _decode_static(self, bs: int, key_len: int | None = None):
        positions = self.in_pos[:bs]
        hidden, logits = self.talker(self.in_embeds[:bs], positions, self.kv.view(0, positions, key_len))
        return hidden[:, 0], logits[:, 0]

    @torch.no_grad()
    def decode(self, seqs: list[Sequence]):
        for s in seqs:
            self.in_embeds[s.slot, 0] = s.next_embed
            self.in_pos[s.slot, 0] = s.num_tokens
            s.num_tokens += 1
        n = max(self.slots) + 1            # persistent batch: rows 0..n-1, holes are padding
        bs = self.pool.padded(n) if self.pool else None
        if bs and bs in self.pool.graphs:
            hidden, logits = self.pool(bs)
        else:  # no capture (CPU, graphs off, or past the largest size): same static path, fewer keys
            key_len = min(self.max_len, _bucket(max(s.num_tokens for s in self.slots.values())))
            hidden, logits = self._decode_static(bs or n, key_len)
        rows = torch.tensor([s.slot for s in seqs], device=self.device)
        return hidden[rows], logits[rows]


class CapacityError(RuntimeError):
    """The profile asks for more static KV cache than the memory budget allows."""


def _check_kv_fits(shape, slots, max_len, dtype, device, utilization) -> None:
    need = 2 * shape.layers * slots * max_len * shape.kv_heads * shape.head_dim * torch.finfo(dtype).bits // 8
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
    else:
        import psutil

        total = psutil.virtual_memory().total
    budget = utilization * total
    if need > budget:
        gib = 1024 ** 3
        raise CapacityError(
            f"runner v2's static KV cache for {slots} seqs x {max_len} positions needs {need / gib:.1f} GiB, "
            f"but stages.0.gpu_memory_utilization={utilization} of {total / gib:.0f} GiB on {device.type} "
            f"allows {budget / gib:.1f} GiB; lower stages.0.max_num_seqs or stages.0.max_model_len, or use runner v1")


def _bucket(n: int, step: int = 256) -> int:
    return -(-n // step) * step


def make_runner(name: str, models, stage_cfg, device, graphs: bool, max_len: int) -> ModelRunner:
    return {"v1": V1Runner, "v2": V2Runner}[name](models, stage_cfg, device, graphs, max_len)
