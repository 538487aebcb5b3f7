"""Elementwise activations in one pass: SnakeBeta over the codec's widest activations, SwiGLU's gate."""
from __future__ import annotations

import torch

from engine.models.kernels.jit import compiled, tl, triton


# -- SnakeBeta: x + sin^2(alpha x) / beta over [B, C, T], alpha and beta per channel, kept as logarithms

def _snake_kernel(x_ptr, log_alpha_ptr, log_beta_ptr, out_ptr, channels, length, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < length
    c = row % channels
    alpha = tl.exp(tl.load(log_alpha_ptr + c).to(tl.float32))
    inv_beta = 1.0 / (tl.exp(tl.load(log_beta_ptr + c).to(tl.float32)) + 1e-9)
    x = tl.load(x_ptr + row.to(tl.int64) * length + offs, mask=inside, other=0.0).to(tl.float32)
    s = tl.sin(x * alpha)
    tl.store(out_ptr + row.to(tl.int64) * length + offs, (x + s * s * inv_beta).to(out_ptr.dtype.element_ty),
             mask=inside)


def snake(x: torch.Tensor, log_alpha: torch.Tensor, log_beta: torch.Tensor) -> torch.Tensor:
    x = x.contiguous()
    b, c, t = x.shape
    out = torch.empty_like(x)
    block = 1024
    compiled(_snake_kernel)[(b * c, triton.cdiv(t, block))](x, log_alpha, log_beta, out, c, t, BLOCK=block)
    return out


# -- SwiGLU's activation: silu(gate) * up from the gate_up product [..., 2I]

def _swiglu_kernel(x_ptr, out_ptr, inter, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < inter
    gate = tl.load(x_ptr + row * 2 * inter + offs, mask=inside, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * 2 * inter + inter + offs, mask=inside, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * inter + offs, (gate * tl.sigmoid(gate) * up).to(out_ptr.dtype.element_ty), mask=inside)


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    gate_up = gate_up.contiguous()
    inter = gate_up.shape[-1] // 2
    out = torch.empty(*gate_up.shape[:-1], inter, dtype=gate_up.dtype, device=gate_up.device)
    rows = gate_up.numel() // gate_up.shape[-1]
    block = 1024
    compiled(_swiglu_kernel)[(rows, triton.cdiv(inter, block))](gate_up, out, inter, BLOCK=block)
    return out
