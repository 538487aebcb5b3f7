"""Model runners for stage 0: one frame (16 codes) for every running request per step.

- `V1Runner` builds the batch anew every step from per-request caches and runs eagerly.
- `V2Runner` keeps a persistent batch: each running request owns a row (slot) of
  preallocated static KV buffers and input buffers.  With CUDA graphs on, a whole frame
  step (talker decode, sampling, the code predictor's 15 passes, the next input) is one
  graph per padded batch size and key bucket; on CPU the same function runs uncaptured,
  so every cell of the matrix runs in CPU CI.

Both runners sample on the device from per-slot state (engine/stage0/sampling.py) and read one
[B, 16] array back per step.  A prefill writes the prompt's keys and values but for its
last position, which is the request's first decode input: a new request's first frame
comes out of the same frame step as everyone else's.  The code predictor keeps a
16-position KV cache of its own and runs one new position a pass, under either runner.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence

from engine.models.graphs import GraphPool, padded
from engine.models.kv_cache import DynamicView, RequestKV, StaticKV
from engine.models.presets import CODEBOOKS
from engine.models.upload import upload
from engine.stage0.kv_budget import buckets, fit_kv
from engine.stage0.sampling import RequestSampler, SlotSampling


@dataclass(eq=False)
class Sequence:
    """A request as stage 0 runs it.  Each is itself alone (identity, not field-wise equality): two requests
    alike in every field are still two, and comparing fields would compare their reference clips'
    arrays, whose truth value numpy refuses."""
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
        self.device = device
        self.capacity = max_len   # positions one request may use: prompt and frames
        self.max_seqs = stage_cfg.max_num_seqs
        self.dtype = self.talker.codec_head.weight.dtype
        self.capture_sizes = sorted({min(s, self.max_seqs) for s in stage_cfg.cuda_graph_sizes} | {self.max_seqs}) \
            if graphs else []
        self.free = list(range(self.max_seqs))
        self.slots: dict[int, Sequence] = {}
        self.sampling = SlotSampling(self.max_seqs, device)
        self.rows = torch.arange(self.max_seqs, device=device)
        self.staged_slots = torch.zeros(self.max_seqs, dtype=torch.long, pin_memory=device.type == "cuda")
        self.staged_rows = self.staged_slots.numpy()
        self.slots_in = torch.zeros(self.max_seqs, dtype=torch.long, device=device)
        # A step is launched before the one ahead is read back (torch_backend.py): the pinned buffers its inputs
        # come from are rewritten once this event, after those copies and ahead of the step's compute, is past.
        self.copied = torch.cuda.Event() if device.type == "cuda" else None
        hidden = self.talker.codec_head.weight.shape[1]
        self.in_embeds = torch.zeros(self.max_seqs, 1, hidden, dtype=self.dtype, device=device)
        # The code predictor's 16-position input and KV cache, rows by batch position: a frame rewrites
        # them from position 0, and a pass attends only to the positions before its own.
        cp = self.cp.shape
        self.cp_in = torch.zeros(self.max_seqs, CODEBOOKS, cp.hidden, dtype=self.dtype, device=device)
        self.cp_kv = StaticKV(cp.layers, self.max_seqs, CODEBOOKS, cp.kv_heads, cp.head_dim, self.dtype, device)
        # pass j runs position j; pass 1 also position 0, the talker's hidden state
        self.cp_spans = [slice(0 if j == 1 else j, j + 1) for j in range(CODEBOOKS)]
        self.cp_positions = [torch.arange(s.start, s.stop, device=device)[None] for s in self.cp_spans]
        self.cp_pool: GraphPool | None = None   # runner v1 replays the passes; v2 runs them inside its frame graph

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

    def pinned_free(self) -> None:
        """Waits until the last step's copies out of pinned memory have run (at once, in practice)."""
        if self.copied is not None:
            self.copied.synchronize()

    def prepare(self, seqs: list[Sequence]) -> None:
        """Before these rows step: their uniforms and stop masks reach the device in one copy."""
        self.pinned_free()
        self.sampling.prepare([s.slot for s in seqs], [s.sampler for s in seqs])

    def slot_rows(self, seqs: list[Sequence]) -> torch.Tensor:
        """These requests' slots on the device, copied from pinned memory: from a list, the copy would wait for
        the whole frame step.  The step's last copy of its inputs: `copied` follows it."""
        n = len(seqs)
        self.staged_rows[:n] = [s.slot for s in seqs]
        rows = self.slots_in[:n].copy_(self.staged_slots[:n], non_blocking=True)
        if self.copied is not None:
            self.copied.record()
        return rows

    # -- one frame from the talker's output, shared by both runners
    def next_frame(self, hidden: torch.Tensor, logits: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """codes [B, 16] of these slots' next frame; their next talker input is written in place."""
        codes = self.residual_codes(hidden, self.sampling.first(logits, rows), rows)
        self.in_embeds[rows, 0] = self.talker.frame_embeds(codes)
        return codes

    def residual_codes(self, hidden: torch.Tensor, c0: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Codebooks 1..15 after c0, one code-predictor pass each; returns all 16.  A pass runs here, or
        is replayed from `cp_pool` for the padded batch size: the same function either way."""
        b = hidden.shape[0]
        self.cp_in[:b, 0] = self.cp.in_proj(hidden)
        self.cp_in[:b, 1] = self.cp.embed(0, c0)
        pooled = padded(self.capture_sizes, b) if self.cp_pool else None
        tokens = [c0]
        for j in range(1, CODEBOOKS):
            hid = self.cp_pool(pooled, j)[:b] if pooled else self.cp_pass(b, j)
            embed = (self.cp.embeds[j - 1], self.cp_in[:b, j + 1]) if j < CODEBOOKS - 1 else None   # next input
            tokens.append(self.sampling.draw(self.cp.logits(j, hid), rows, j, embed))
        return torch.stack(tokens, 1)

    def cp_pass(self, b: int, j: int) -> torch.Tensor:
        """The code predictor's hidden state at position j for rows 0..b-1: [b, hidden]."""
        positions = self.cp_positions[j].expand(b, -1)
        return self.cp.decoder(self.cp_in[:b, self.cp_spans[j]], positions, self.cp_kv.view(0, positions))[:, -1]

    def take_prompt(self, seq: Sequence) -> torch.Tensor:
        """What a prefill writes to the cache: all of the prompt but its last position, which becomes the
        request's first decode input."""
        seq.num_tokens = seq.prompt.shape[0] - 1
        self.in_embeds[seq.slot, 0] = seq.prompt[-1]
        return seq.prompt[:-1]


class V1Runner(ModelRunner):
    """Builds the batch anew every step from per-request caches, and runs the talker eagerly."""
    name = "v1"

    def __init__(self, models, stage_cfg, device, graphs, max_len):
        super().__init__(models, stage_cfg, device, graphs, max_len)
        if graphs:   # the code predictor's passes, per padded batch size; the talker runs eagerly
            keys = [(bs, j) for bs in self.capture_sizes for j in range(1, CODEBOOKS)]
            self.cp_pool = GraphPool(self.cp_pass, keys, device)

    def add(self, seq: Sequence) -> None:
        super().add(seq)
        seq.kv = RequestKV(len(self.talker.decoder.layers))

    def release(self, seq: Sequence) -> None:
        super().release(seq)
        seq.kv = None

    @torch.no_grad()
    def prefill(self, seqs: list[Sequence]) -> None:
        """One talker pass per request, each into its own cache."""
        for seq in seqs:
            prompt = self.take_prompt(seq)
            if len(prompt):
                positions = torch.arange(len(prompt), device=self.device)[None]
                self.talker.decoder(prompt[None], positions, DynamicView([seq.kv], positions))

    @torch.no_grad()
    def decode(self, seqs: list[Sequence]) -> torch.Tensor:
        """One frame for each running request: codes [B, 16]."""
        self.prepare(seqs)
        rows = self.slot_rows(seqs)
        positions = upload(torch.tensor([[s.num_tokens] for s in seqs]), self.device)
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
        self.capacity = fit_kv(shape, self.max_seqs, max_len, self.dtype, device, stage_cfg.gpu_memory_utilization)
        # one spare slot past the persistent batch: a captured prefill's padding rows write there
        self.spare = self.max_seqs
        self.kv = StaticKV(shape.layers, self.max_seqs + 1, self.capacity, shape.kv_heads, shape.head_dim, self.dtype,
                           device)
        self.in_pos = torch.zeros(self.max_seqs, 1, dtype=torch.long, device=device)
        self.host_pos = torch.zeros(self.max_seqs, 1, dtype=torch.long, pin_memory=device.type == "cuda")
        self.host_pos_rows = self.host_pos.numpy()   # written a row per request each step, without a torch call
        self.buckets = buckets(self.capacity)
        captured = graphs and device.type == "cuda"
        keys = [(bs, kl) for bs in self.capture_sizes for kl in self.buckets] if captured else []
        self.pool = GraphPool(self._frame, keys, device) if graphs else None
        # Prefills are captured per padded (requests, width) within four prompt budgets of positions (a step
        # admits up to one budget, padded to powers of two on both sides), and at most 4096: past that the
        # graphs' memory grows and the launches a graph saves no longer matter.
        positions = min(4 * stage_cfg.max_num_batched_tokens, 4096)
        widths = [w for w in (16, 32, 64, 128, 256, 512, 1024, 2048) if w <= min(self.capacity, positions)]
        keys = [(k, w) for w in widths for k in self.capture_sizes if k * w <= positions] if captured else []
        self.prefill_pool = None
        if keys:
            self.prefill_in = torch.zeros(max(k for k, _ in keys), max(widths), shape.hidden, dtype=self.dtype,
                                          device=device)
            self.prefill_slots = torch.full((len(self.prefill_in),), self.spare, device=device)
            self.host_slots = torch.full((len(self.prefill_in),), self.spare, pin_memory=True)
            self.prefill_pool = GraphPool(lambda k, w: self._prefill(self.prefill_in[:k, :w], self.prefill_slots[:k]),
                                          keys, device)

    @torch.no_grad()
    def prefill(self, seqs: list[Sequence]) -> None:
        """One talker pass over all these prompts, right-padded to the longest, each into its own slot's
        rows.  A padded position's keys land past its request's prompt, where its own decode steps
        overwrite them, in order, before any query can see them."""
        prompts = [self.take_prompt(seq) for seq in seqs]
        slots = [seq.slot for seq in seqs]
        k, width = len(prompts), max(len(p) for p in prompts)
        if width == 0:
            return
        key = min(((kp, w) for kp, w in self.prefill_pool.graphs if kp >= k and w >= width),
                  key=lambda kw: kw[0] * kw[1], default=None) if self.prefill_pool else None
        if key is None:
            self._prefill(pad_sequence(prompts, batch_first=True), upload(torch.tensor(slots), self.device))
            return
        self.prefill_in[:k, :width] = pad_sequence(prompts, batch_first=True)
        self.pinned_free()
        self.host_slots[:k] = torch.tensor(slots)
        self.host_slots[k:] = self.spare
        self.prefill_slots.copy_(self.host_slots, non_blocking=True)
        self.prefill_pool(*key)

    def _prefill(self, prompts: torch.Tensor, slots: torch.Tensor) -> None:
        b, width = prompts.shape[:2]
        positions = torch.arange(width, device=self.device)[None].expand(b, width)
        self.talker.decoder(prompts, positions, self.kv.view(slots, positions, width))

    def _frame(self, bs: int, key_len: int):
        positions = self.in_pos[:bs]
        hidden, logits = self.talker(self.in_embeds[:bs], positions, self.kv.view(0, positions, key_len))
        return self.next_frame(hidden[:, 0], logits[:, 0], self.rows[:bs])

    @torch.no_grad()
    def decode(self, seqs: list[Sequence]) -> torch.Tensor:
        """One frame for each running request: codes [B, 16], from rows 0..n-1 of the persistent batch
        (holes are padding)."""
        self.prepare(seqs)
        self.host_pos_rows.fill(0)   # holes and rows not launched are padding: position 0 of their own slot
        for s in seqs:
            self.host_pos_rows[s.slot, 0] = s.num_tokens
            s.num_tokens += 1
        self.in_pos.copy_(self.host_pos, non_blocking=True)
        rows = self.slot_rows(seqs)
        n = max(self.slots) + 1
        key_len = next(b for b in self.buckets if b >= max(s.num_tokens for s in self.slots.values()))
        bs = padded(self.capture_sizes, n) if self.pool else None
        codes = self.pool(bs, key_len) if bs else self._frame(n, key_len)
        return codes[rows]


def make_runner(name: str, models, stage_cfg, device, graphs: bool, max_len: int) -> ModelRunner:
    return {"v1": V1Runner, "v2": V2Runner}[name](models, stage_cfg, device, graphs, max_len)
