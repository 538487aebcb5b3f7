"""A decode step's RMS norm and the matrix product after it, in one kernel: the gate/up product with
SwiGLU's activation on its output (a frame step runs 103 MLPs, each of which was a norm, a product and
an activation kernel).  It also computes a plain product (q/k/v), which the engine leaves to cuBLAS:
fused, that took twice as long (README, "The frame step").

The norm's per-row scale commutes with the product, so each program accumulates its rows' sums of
squares while it walks the hidden dimension for the product, and scales the result at the end.  The
eager path is engine/models/layers.py's RMSNorm then F.linear (then SwiGLU's activation)."""
from __future__ import annotations

import torch

from engine.models.kernels.jit import compiled, tl, triton

# A decode step's rows (a frame step's batch); longer inputs (prefill) take cuBLAS's tiles.
MAX_ROWS = 128
# benchmarks/kernel_tiles.py at 64 rows on an H100: these take 14.3 us for q/k/v and 16.4 us for gate/up
# with SwiGLU, against 6.3 and 12.8 us eager; BLOCK_K 256 (q/k/v) or 64 (gate/up) is a little faster, none
# comes within 2x for q/k/v
TILES = {"BLOCK_N": 32, "BLOCK_K": 128, "num_warps": 4, "num_stages": 3}


def _norm_linear_kernel(x_ptr, norm_ptr, w_ptr, out_ptr, rows, hidden, cols, eps, GATED: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """One program per [BLOCK_M, BLOCK_N] tile of the output; for a gated product it also accumulates
    the matching up columns (cols further on in the weight) and writes silu(gate) * up."""
    m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    live_m, live_n = m < rows, n < cols
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    squares = tl.zeros((BLOCK_M,), tl.float32)
    for start in range(0, hidden, BLOCK_K):
        k = start + tl.arange(0, BLOCK_K)
        live_k = k < hidden
        x = tl.load(x_ptr + m.to(tl.int64)[:, None] * hidden + k[None, :],
                    mask=live_m[:, None] & live_k[None, :], other=0.0).to(tl.float32)
        squares += tl.sum(x * x, 1)
        a = (x * tl.load(norm_ptr + k, mask=live_k, other=0.0).to(tl.float32)[None, :]).to(w_ptr.dtype.element_ty)
        w_at = w_ptr + n.to(tl.int64)[None, :] * hidden + k[:, None]
        w_live = live_k[:, None] & live_n[None, :]
        acc = tl.dot(a, tl.load(w_at, mask=w_live, other=0.0), acc)
        if GATED:
            acc_up = tl.dot(a, tl.load(w_at + cols * hidden, mask=w_live, other=0.0), acc_up)
    scale = (1.0 / tl.sqrt(squares / hidden + eps))[:, None]
    y = acc * scale
    if GATED:
        y = y * tl.sigmoid(y) * (acc_up * scale)
    tl.store(out_ptr + m.to(tl.int64)[:, None] * cols + n[None, :], y.to(out_ptr.dtype.element_ty),
             mask=live_m[:, None] & live_n[None, :])


def norm_linear(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor,
                gated: bool = False) -> torch.Tensor:
    """rms_norm(x) @ weight.T for x [..., hidden], weight [cols, hidden]; gated (weight [2I, hidden], gate
    rows then up rows): silu(gate) * up, [..., I]."""
    x = x.contiguous()
    hidden = x.shape[-1]
    rows = x.numel() // hidden
    cols = weight.shape[0] // 2 if gated else weight.shape[0]
    assert weight.is_contiguous() and weight.shape[1] == hidden and rows <= MAX_ROWS
    out = torch.empty(*x.shape[:-1], cols, dtype=x.dtype, device=x.device)
    block_m = max(16, min(64, triton.next_power_of_2(rows)))
    grid = (triton.cdiv(cols, TILES["BLOCK_N"]), triton.cdiv(rows, block_m))
    compiled(_norm_linear_kernel)[grid](x, norm_weight, weight, out, rows, hidden, cols, eps,
                                        GATED=gated, BLOCK_M=block_m, **TILES)
    return out
