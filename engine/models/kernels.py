"""Fused kernels (Triton) for the hot spots of a frame step and of a codec pass.

A frame step at C64 ran about 3,600 CUDA kernels, most of them a few microseconds of
elementwise work; a codec pass spends its memory traffic on SnakeBeta's five passes over
the widest activations.  Each function here does in one kernel what the eager code
beside it does in many, and computes the same function: `sample` the same tokens as
engine/stage0/sampling.py's `sample` (up to ties at the top-p edge and float summation
order), `snake` SnakeBeta.

They run where `use(x)` says: on CUDA when Triton is importable, and on the CPU under
Triton's interpreter (TRITON_INTERPRET=1), which is how the CPU tests hold them to the
eager code.  `LANEKEEPER_KERNELS=torch` or `unfused()` turns them off, to measure or
compare against the eager path.  Kernels are compiled on first use, under the
environment of that moment.
"""
from __future__ import annotations

import os
from contextlib import contextmanager

import torch

try:
    import triton
    import triton.language as tl
except ImportError:   # a CPU install without Triton runs the eager code
    triton = tl = None

_off = os.environ.get("LANEKEEPER_KERNELS", "fused") == "torch"


def use(x: torch.Tensor) -> bool:
    if triton is None or _off:
        return False
    return x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"


@contextmanager
def unfused():
    """The eager path inside the block, whatever the environment says."""
    global _off
    saved, _off = _off, True
    try:
        yield
    finally:
        _off = saved


_compiled: dict[tuple[str, bool], object] = {}


def _kernel(fn):
    key = (fn.__name__, os.environ.get("TRITON_INTERPRET") == "1")
    if key not in _compiled:
        _compiled[key] = triton.jit(fn)
    return _compiled[key]


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
    _kernel(_snake_kernel)[(b * c, triton.cdiv(t, block))](x, log_alpha, log_beta, out, c, t, BLOCK=block)
    return out


# -- sampling: temperature, top-k, top-p and the inverse-CDF draw of one row per program, without a sort

def _ordered(x):
    """Float32 -> int32 keys in the same order (the sign-magnitude bits folded into two's complement)."""
    bits = x.to(tl.int32, bitcast=True)
    return tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)


def _sample_kernel(logits_ptr, stride, rows_ptr, temperature_ptr, top_k_ptr, top_p_ptr, u_ptr, u_stride, codebook,
                   out_ptr, vocab, BLOCK: tl.constexpr):
    r = tl.program_id(0)
    slot = tl.load(rows_ptr + r)
    temperature = tl.load(temperature_ptr + slot)
    top_k = tl.load(top_k_ptr + slot)
    top_p = tl.load(top_p_ptr + slot)
    u = tl.load(u_ptr + slot * u_stride + codebook)
    offs = tl.arange(0, BLOCK)
    valid = offs < vocab
    raw = tl.load(logits_ptr + r.to(tl.int64) * stride + offs, mask=valid, other=float("-inf")).to(tl.float32)
    greedy = tl.argmax(raw, 0, tie_break_left=True)
    x = raw / tl.maximum(temperature, 1e-5)
    key = _ordered(x)
    k = tl.where((top_k > 0) & (top_k < vocab), top_k, vocab)
    # the k-th largest key: the largest t that at least k keys reach (ties at it are all kept, as a sort's
    # threshold keeps them), by bisection over the 2^32 keys
    lo = tl.full((), -2147483648, tl.int64)
    hi = tl.full((), 2147483647, tl.int64)
    for _ in range(32):
        mid = lo + (hi - lo + 1) // 2
        enough = tl.sum((valid & (key.to(tl.int64) >= mid)).to(tl.int32), 0) >= k
        lo = tl.where(enough, mid, lo)
        hi = tl.where(enough, hi, mid - 1)
    keep = valid & (key.to(tl.int64) >= lo)
    x = tl.where(keep, x, float("-inf"))
    probs = tl.exp(x - tl.max(x, 0))
    probs = probs / tl.sum(probs, 0)
    if top_p < 1.0:
        # keep a token while the mass ranked strictly above it is at most top_p: the smallest t whose mass
        # above is at most top_p, by bisection again
        lo = tl.full((), -2147483648, tl.int64)
        hi = tl.full((), 2147483647, tl.int64)
        for _ in range(32):
            mid = lo + (hi - lo) // 2
            fits = tl.sum(tl.where(key.to(tl.int64) > mid, probs, 0.0), 0) <= top_p
            hi = tl.where(fits, mid, hi)
            lo = tl.where(fits, lo, mid + 1)
        probs = tl.where(key.to(tl.int64) >= lo, probs, 0.0)
    cdf = tl.cumsum(probs, 0)
    picked = tl.sum((valid & (cdf <= u * tl.max(cdf, 0))).to(tl.int32), 0)
    picked = tl.minimum(picked, vocab - 1)
    tl.store(out_ptr + r, tl.where(temperature > 0, picked.to(tl.int64), greedy.to(tl.int64)))


def sample(logits: torch.Tensor, rows: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
           top_p: torch.Tensor, u: torch.Tensor, codebook: int) -> torch.Tensor:
    """One token per row of logits [R, V]; row r's parameters and uniforms are those of slot rows[r]."""
    out = torch.empty(logits.shape[0], dtype=torch.long, device=logits.device)
    block = triton.next_power_of_2(logits.shape[1])
    _kernel(_sample_kernel)[(logits.shape[0],)](logits, logits.stride(0), rows, temperature, top_k, top_p, u,
                                                u.stride(0), codebook, out, logits.shape[1], BLOCK=block,
                                                num_warps=8)
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
    _kernel(_swiglu_kernel)[(rows, triton.cdiv(inter, block))](gate_up, out, inter, BLOCK=block)
    return out
