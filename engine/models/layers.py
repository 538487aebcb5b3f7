"""Qwen3-style building blocks: RMSNorm, rotary positions, grouped-query attention, SwiGLU.

Attention does not own its KV cache.  It hands this step's keys and values to a
cache view (engine/models/kv_cache.py) that the model runner chose, and gets back the
keys and values to attend over plus a mask.  That is what lets runner v1
(per-request dynamic caches) and v2 (static slot buffers, graph-capturable)
share every layer.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from engine.models import kernels
from engine.models.presets import DecoderShape


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.folded = False   # its scale moved into the product that reads it (fold_into): its weight is ones

    @torch.no_grad()
    def fold_into(self, weight: torch.Tensor) -> None:
        """Move this norm's per-channel scale into the product that reads its output (weight [out, dim]): the
        same function, and the fused path can then run the product on the unnormed rows and apply each row's
        1 / rms after it (a per-row scale commutes with the product), in the kernel that reads the product,
        where a norm kernel ran before it."""
        weight.mul_(self.weight)
        self.weight.fill_(1.0)
        self.folded = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # torch's own: one fused kernel on CUDA (computing in float32), where the written-out form was
        # eight, and a frame step runs over four hundred norms
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class Rotary(nn.Module):
    def __init__(self, head_dim: int, theta: float, max_positions: int = 65536):
        super().__init__()
        inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv)
        # laid out for rotate(): both halves' cosines, and the sines with the first half's negated
        self.register_buffer("cos", torch.cat((freqs.cos(), freqs.cos()), -1), persistent=False)
        self.register_buffer("sin", torch.cat((-freqs.sin(), freqs.sin()), -1), persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> "Rope":
        return Rope(self, positions, dtype)


class Rope:
    """One pass's rotary angles.  The eager path looks them up at the positions once, when the first layer
    asks, and every layer shares them; the fused decode kernel reads the tables itself."""

    def __init__(self, rotary: Rotary, positions: torch.Tensor, dtype: torch.dtype):
        self.tables = (rotary.cos, rotary.sin)
        self.positions, self.dtype = positions, dtype

    @functools.cached_property
    def at_positions(self) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [B, S, 1, D] at positions [B, S]."""
        cos, sin = self.tables
        return cos[self.positions].unsqueeze(2).to(self.dtype), sin[self.positions].unsqueeze(2).to(self.dtype)


def rotate(x: torch.Tensor, rope: Rope) -> torch.Tensor:
    """x [B, S, H, D] turned by its positions' angles: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin), in
    three kernels (a frame step rotates a hundred times over)."""
    cos, sin = rope.at_positions
    x1, x2 = x.chunk(2, dim=-1)
    return torch.addcmul(x * cos, torch.cat((x2, x1), dim=-1), sin)


def add_linear(residual: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """residual += x @ weight.T, in place: one matrix product that adds as it writes.  (Out of place,
    addmm first copies the residual into its result: two hundred copies a frame step.)  The residual
    stream is the decoder's own (Decoder.forward copies its input once)."""
    residual.view(-1, residual.shape[-1]).addmm_(x.reshape(-1, x.shape[-1]), weight.t())
    return residual


def normed_linear(x: torch.Tensor, norm: RMSNorm, weight: torch.Tensor, gated: bool = False) -> torch.Tensor:
    """norm(x) @ weight.T; gated: silu(gate) * up of its two halves.  Fused, with the norm folded into the
    weight, gated rows take cuBLAS's product of the unnormed rows and one kernel for the norm's row scale
    and the activation (a norm kernel fewer for each of a frame step's 103 MLPs; a Triton kernel doing
    norm and product at once took twice as long: README, "The frame step")."""
    if gated and norm.folded and kernels.use(x):
        return kernels.swiglu(F.linear(x, weight), normed=x, eps=norm.eps)
    y = F.linear(norm(x), weight)
    if not gated:
        return y
    if kernels.use(x):
        return kernels.swiglu(y)
    gate, up = y.chunk(2, dim=-1)
    return F.silu(gate) * up


class Attention(nn.Module):
    def __init__(self, shape: DecoderShape, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.heads, self.kv_heads, self.head_dim = shape.heads, shape.kv_heads, shape.head_dim
        # q, k and v in one matrix product: a frame step runs 103 layer passes, each a launch saved
        self.qkv_proj = nn.Linear(shape.hidden, (shape.heads + 2 * shape.kv_heads) * shape.head_dim, bias=False)
        self.o_proj = nn.Linear(shape.heads * shape.head_dim, shape.hidden, bias=False)
        self.q_norm = RMSNorm(shape.head_dim)
        self.k_norm = RMSNorm(shape.head_dim)

    def forward(self, x, norm, rope, cache):
        """x += attention(norm(x)), in place (add_linear): x is the residual stream."""
        b, s, _ = x.shape
        if kernels.use(x) and cache.in_place:   # a decode step over static buffers: one kernel after the product
            folded = norm.folded   # then the kernel applies the norm's row scale, and no norm kernel runs
            qkv = F.linear(x, self.qkv_proj.weight) if folded else normed_linear(x, norm, self.qkv_proj.weight)
            keys, values = cache.buffers(self.layer_idx)
            out = kernels.decode_attention(qkv, self.q_norm.weight, self.k_norm.weight, self.q_norm.eps, rope.tables,
                                           keys, values, cache.read.start, cache.positions, cache.key_len,
                                           self.heads, self.kv_heads, normed=x if folded else None,
                                           norm_eps=norm.eps)
            return add_linear(x, out, self.o_proj.weight)
        qkv = normed_linear(x, norm, self.qkv_proj.weight)
        q, k, v = qkv.view(b, s, -1, self.head_dim).split((self.heads, self.kv_heads, self.kv_heads), 2)
        q, k = self.q_norm(q), self.k_norm(k)
        q, k = rotate(torch.cat((q, k), 2), rope).split((self.heads, self.kv_heads), 2)   # one rotation for both
        keys, values, mask = cache.update(self.layer_idx, k, v)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
            attn_mask=mask.unsqueeze(1), enable_gqa=self.heads != self.kv_heads)
        return add_linear(x, out.transpose(1, 2).reshape(b, s, -1), self.o_proj.weight)


class SwiGLU(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_up = nn.Linear(hidden, 2 * intermediate, bias=False)
        self.down = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x, norm):
        """x += SwiGLU(norm(x)), in place (add_linear): x is the residual stream."""
        return add_linear(x, normed_linear(x, norm, self.gate_up.weight, gated=True), self.down.weight)


class DecoderLayer(nn.Module):
    def __init__(self, shape: DecoderShape, layer_idx: int):
        super().__init__()
        self.input_norm = RMSNorm(shape.hidden)
        self.attn = Attention(shape, layer_idx)
        self.post_norm = RMSNorm(shape.hidden)
        self.mlp = SwiGLU(shape.hidden, shape.intermediate)

    def fold_norms(self) -> None:
        """Both norms into the products that read them (RMSNorm.fold_into): the same layer, fewer kernels."""
        self.input_norm.fold_into(self.attn.qkv_proj.weight)
        self.post_norm.fold_into(self.mlp.gate_up.weight)

    def forward(self, x, rope, cache):
        x = self.attn(x, self.input_norm, rope, cache)
        return self.mlp(x, self.post_norm)


class Decoder(nn.Module):
    """A stack of decoder layers with a final norm; embeddings and heads belong to the model."""

    def __init__(self, shape: DecoderShape, max_positions: int = 65536):
        super().__init__()
        self.rotary = Rotary(shape.head_dim, shape.rope_theta, max_positions)
        self.layers = nn.ModuleList(DecoderLayer(shape, i) for i in range(shape.layers))
        self.norm = RMSNorm(shape.hidden)

    def forward(self, x, positions, cache):
        rope = self.rotary(positions, x.dtype)
        x = x.clone(memory_format=torch.contiguous_format)   # the residual stream, added to in place
        for layer in self.layers:
            x = layer(x, rope, cache)
        return self.norm(x)
