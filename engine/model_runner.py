"""Model runners for stage 0: one frame (16 codes) for every running request per step.

- `V1Runner` builds the batch anew every step from per-request caches and runs eagerly.
- `V2Runner` keeps a persistent batch: each running request owns a row (slot) of
  preallocated static KV buffers and input buffers.  With CUDA graphs on, a whole frame
  step (talker decode, sampling, the code predictor's 15 passes, the next input) is one
  graph per padded batch size and key bucket; on CPU the same function runs uncaptured,
  so every cell of the matrix runs in CPU CI.

Both runners sample on the device from per-slot state (engine/sampling.py) and read one
[B, 16] array back per step.  The code predictor runs on its fixed 16-position buffer
whenever graphs are on, under either runner.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence

from engine.graphs import GraphPool, padded
from engine.kv_cache import CausalView, DynamicView, RequestKV, StaticKV
from engine.presets import CODEBOOKS
from engine.sampling import RequestSampler, SlotSampling


@dataclass
class Sequence:
    """A request as stage 0 runs it."""
    request: object
    sampler: RequestSampler
    prompt: torch.Tensor                  # [S, hidden]
    num_tokens: int = 0                   # positions written to the KV cache
    frames: list[np.ndarray] = field(default_factory=list)
    slot: int | None = None
    kv: RequestKV | None = None

    @property
    def request_id(self) -> str:
        return self.request.request_id


class ModelRunner:
    """What both runners share: request slots, their sampling state and next inputs, and one frame's
    codes from the talker's hidden state and logits (codebook 0, then the code predictor's 15)."""

    def __init__(self, models, stage_cfg, device: torch.device, graphs: bool, max_len: int):
        self.talker, self.cp = models.talker, models.code_predictor
        self.device, self.graphs, self.max_len = device, graphs, max_len
        self.capacity = max_len   # positions one request may use: prompt and frames
        self.max_seqs = stage_cfg.max_num_seqs
        self.dtype = self.talker.codec_head.weight.dtype
        self.capture_sizes = sorted({min(s, self.max_seqs) for s in stage_cfg.cuda_graph_sizes} | {self.max_seqs}) \
            if graphs else []
        self.free = list(range(self.max_seqs))
        self.slots: dict[int, Sequence] = {}
        self.sampling = SlotSampling(self.max_seqs, device)
        self.rows = torch.arange(self.max_seqs, device=device)
        hidden = self.talker.codec_head.weight.shape[1]
        self.in_embeds = torch.zeros(self.max_seqs, 1, hidden, dtype=self.dtype, device=device)
        if graphs:   # the code predictor's fixed 16-position input, written in place
            hc = self.cp.in_proj.weight.shape[0]
            self.cp_buf = torch.zeros(self.max_seqs, CODEBOOKS, hc, dtype=self.dtype, device=device)
            self.cp_view = CausalView(torch.arange(CODEBOOKS, device=device)[None])
        self.cp_pool = self.cp_graphs()   # for frames not made inside a whole-frame graph

    def add(self, seq: Sequence) -> None:
        self.free.sort()
        seq.slot = self.free.pop(0)
        self.slots[seq.slot] = seq
        self.sampling.admit(seq.slot, seq.sampler)

    def release(self, seq: Sequence) -> None:
        if seq.slot is not None:
            del self.slots[seq.slot]
            self.free.append(seq.slot)
            self.in_embeds[seq.slot].zero_()
            self.sampling.release(seq.slot)
            seq.slot = None

    def prepare(self, seqs: list[Sequence]) -> None:
        """Before these rows step: their uniforms and stop masks reach the device in one copy."""
        self.sampling.prepare([s.slot for s in seqs], [s.sampler for s in seqs])

    def slot_rows(self, seqs: list[Sequence]) -> torch.Tensor:
        return torch.tensor([s.slot for s in seqs], device=self.device)

    # -- one frame from the talker's output, shared by both runners
    def next_frame(self, hidden: torch.Tensor, logits: torch.Tensor, rows: torch.Tensor,
                   static_cp: bool = False) -> torch.Tensor:
        """codes [B, 16] of these slots' next frame; their next talker input is written in place."""
        codes = self.residual_codes(hidden, self.sampling.first(logits, rows), rows, static_cp)
        self.in_embeds[rows, 0] = self.talker.frame_embeds(codes)
        return codes

    def residual_codes(self, hidden: torch.Tensor, c0: torch.Tensor, rows: torch.Tensor,
                       static_cp: bool = False) -> torch.Tensor:
        """Codebooks 1..15 after c0, one code-predictor pass each; returns all 16.

        With graphs on, the predictor's input is a fixed 16-position buffer: run inline
        (`static_cp`, inside runner v2's frame graph) or replayed per batch size from
        `cp_pool`.  With graphs off it grows by one position a pass.  All give the same codes.
        """
        b = hidden.shape[0]
        tokens = [c0]
        first = self.cp.in_proj(hidden)
        static_bs = b if static_cp else padded(self.capture_sizes, b) if self.graphs else None
        if static_bs:
            self.cp_buf[:b, 0] = first
            self.cp_buf[:b, 1] = self.cp.embed(0, c0)
        else:
            seq = torch.stack((first, self.cp.embed(0, c0)), 1)
        for j in range(1, CODEBOOKS):
            if static_cp:
                hid = self.cp.hidden(self.cp_buf[:b], self.cp_view)[:, j]
            elif static_bs:
                hid = self.cp_pool(static_bs)[:b, j]
            else:
                hid = self.cp.hidden(seq, CausalView(torch.arange(j + 1, device=self.device)[None]))[:, j]
            token = self.sampling.draw(self.cp.logits(j, hid), rows, j)
            tokens.append(token)
            if j < CODEBOOKS - 1:
                emb = self.cp.embed(j, token)
                if static_bs:
                    self.cp_buf[:b, j + 1] = emb
                else:
                    seq = torch.cat((seq, emb[:, None]), 1)
        return torch.stack(tokens, 1)

    def cp_graphs(self) -> GraphPool | None:
        """The code predictor captured per batch size, for runs that do not capture a whole frame."""
        if not self.graphs:
            return None
        return GraphPool(lambda bs: self.cp.hidden(self.cp_buf[:bs], self.cp_view),
                         [(bs,) for bs in self.capture_sizes], self.device)

    @torch.no_grad()
    def prefill_frames(self, seqs: list[Sequence], hidden: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """The first frame of requests just prefilled."""
        self.prepare(seqs)
        return self.next_frame(hidden, logits, self.slot_rows(seqs))


class V1Runner(ModelRunner):
    """Builds the batch anew every step from per-request caches, and runs the talker eagerly."""
    name = "v1"

    def add(self, seq: Sequence) -> None:
        super().add(seq)
        seq.kv = RequestKV(len(self.talker.decoder.layers))

    def release(self, seq: Sequence) -> None:
        super().release(seq)
        seq.kv = None

    @torch.no_grad()
    def prefill(self, seqs: list[Sequence]):
        """The last prompt position's hidden state and logits of each: [B, hidden], [B, vocab].  One
        talker pass per request, each into its own cache."""
        out = []
        for seq in seqs:
            s = seq.prompt.shape[0]
            positions = torch.arange(s, device=self.device)[None]
            hidden, logits = self.talker(seq.prompt[None], positions, DynamicView([seq.kv], positions))
            seq.num_tokens = s
            out.append((hidden[0, -1], logits[0, -1]))
        return torch.stack([h for h, _ in out]), torch.stack([lg for _, lg in out])

    @torch.no_grad()
    def decode(self, seqs: list[Sequence]) -> torch.Tensor:
        """One frame for each running request: codes [B, 16]."""
        self.prepare(seqs)
        rows = self.slot_rows(seqs)
        positions = torch.tensor([[s.num_tokens] for s in seqs], device=self.device)
        hidden, logits = self.talker(self.in_embeds[rows], positions, DynamicView([s.kv for s in seqs], positions))
        for s in seqs:
            s.num_tokens += 1
        return self.next_frame(hidden[:, 0], logits[:, 0], rows)


class V2Runner(ModelRunner):
    """A persistent batch: each running request owns a row (slot) of static KV and input buffers, and a
    frame step (talker decode, codebook-0 sampling, the code predictor's 15 passes) is one function of
    those buffers.  With graphs on it is captured per padded batch size and key bucket and replayed;
    on CPU the same function runs uncaptured, so every cell of the matrix runs in CPU CI."""
    name = "v2"

    def __init__(self, models, stage_cfg, device, graphs, max_len):
        super().__init__(models, stage_cfg, device, graphs, max_len)
        shape = self.talker.shape
        self.capacity = _fit_kv(shape, self.max_seqs, max_len, self.dtype, device, stage_cfg.gpu_memory_utilization)
        self.kv = StaticKV(shape.layers, self.max_seqs, self.capacity, shape.kv_heads, shape.head_dim, self.dtype, device)
        self.in_pos = torch.zeros(self.max_seqs, 1, dtype=torch.long, device=device)
        self.host_pos = torch.zeros(self.max_seqs, 1, dtype=torch.long, pin_memory=device.type == "cuda")
        self.buckets = _buckets(self.capacity)
        keys = [(bs, kl) for bs in self.capture_sizes for kl in self.buckets] if device.type == "cuda" else []
        self.pool = GraphPool(self._frame, keys, device) if graphs else None

    def release(self, seq: Sequence) -> None:
        if seq.slot is not None:
            self.host_pos[seq.slot] = 0
        super().release(seq)

    @torch.no_grad()
    def prefill(self, seqs: list[Sequence]):
        """One talker pass over all these prompts, right-padded to the longest, each into its own slot's
        rows.  A padded position's keys land past its request's prompt, where its own decode steps
        overwrite them, in order, before any query can see them."""
        lens = [seq.prompt.shape[0] for seq in seqs]
        width = max(lens)
        prompts = pad_sequence([seq.prompt for seq in seqs], batch_first=True)
        positions = torch.arange(width, device=self.device)[None].expand(len(seqs), width)
        slots = torch.tensor([seq.slot for seq in seqs], device=self.device)
        hidden, logits = self.talker(prompts, positions, self.kv.view(slots, positions, _bucket(width)))
        for seq, s in zip(seqs, lens):
            seq.num_tokens = s
        rows = torch.arange(len(seqs), device=self.device)
        last = torch.tensor(lens, device=self.device) - 1
        return hidden[rows, last], logits[rows, last]

    def _frame(self, bs: int, key_len: int):
        positions = self.in_pos[:bs]
        hidden, logits = self.talker(self.in_embeds[:bs], positions, self.kv.view(0, positions, key_len))
        return self.next_frame(hidden[:, 0], logits[:, 0], self.rows[:bs], static_cp=self.graphs)

    @torch.no_grad()
    def decode(self, seqs: list[Sequence]) -> torch.Tensor:
        """One frame for each running request: codes [B, 16], from rows 0..n-1 of the persistent batch
        (holes are padding)."""
        self.prepare(seqs)
        for s in seqs:
            self.host_pos[s.slot, 0] = s.num_tokens
            s.num_tokens += 1
        self.in_pos.copy_(self.host_pos, non_blocking=True)
        n = max(self.slots) + 1
        key_len = next(b for b in self.buckets if b >= max(s.num_tokens for s in self.slots.values()))
        bs = padded(self.capture_sizes, n) if self.pool else None
        codes = self.pool(bs, key_len) if bs else self._frame(n, key_len)
        return codes[self.slot_rows(seqs)]


class CapacityError(RuntimeError):
    """The profile asks for more static KV cache than the memory budget allows."""


def _fit_kv(shape, slots, max_len, dtype, device, utilization) -> int:
    """Positions of static KV cache per slot: max_len when slots x max_len fits the memory budget, else
    as many as do fit (requests longer than that are refused one by one), down to a floor."""
    per_position = 2 * shape.layers * shape.kv_heads * shape.head_dim * torch.finfo(dtype).bits // 8
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
    else:
        import psutil

        total = psutil.virtual_memory().total
    budget = utilization * total
    fits = min(max_len, int(budget // (slots * per_position)) // 256 * 256)
    if fits < min(max_len, 512):
        gib = 1024 ** 3
        raise CapacityError(
            f"runner v2's static KV cache for {slots} seqs needs {slots * min(max_len, 512) * per_position / gib:.1f} "
            f"GiB for even {min(max_len, 512)} positions each, but stages.0.gpu_memory_utilization={utilization} of "
            f"{total / gib:.0f} GiB on {device.type} allows {budget / gib:.1f} GiB; lower stages.0.max_num_seqs, "
            f"raise stages.0.gpu_memory_utilization, or use runner v1")
    return fits


def _bucket(n: int, step: int = 256) -> int:
    return -(-n // step) * step


def _buckets(kv_len: int) -> list[int]:
    """Key lengths a decode step attends over: powers of two from 256, then the whole cache."""
    out, b = [], 256
    while b < kv_len:
        out.append(b)
        b *= 2
    return out + [kv_len]


def make_runner(name: str, models, stage_cfg, device, graphs: bool, max_len: int) -> ModelRunner:
    return {"v1": V1Runner, "v2": V2Runner}[name](models, stage_cfg, device, graphs, max_len)
