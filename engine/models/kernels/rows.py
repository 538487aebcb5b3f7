"""Each row's 1 / rms, for the kernels that read a product whose input's RMS norm was folded into it
(engine/models/layers.py, `RMSNorm.fold_into`).  The norm's per-row scale commutes with the product, so
the kernel reading the product applies it, and no norm kernel runs before the product."""
from __future__ import annotations

from engine.models.kernels.jit import tl


def _row_scale(x_ptr, tokens, live, hidden, eps, SCALED: tl.constexpr, R: tl.constexpr, BLOCK_H: tl.constexpr):
    """1 / rms of the input rows [R] of these tokens (rows of x, `hidden` wide), or ones where not SCALED."""
    if not SCALED:
        return tl.full((R,), 1.0, tl.float32)
    squares = tl.zeros((R,), tl.float32)
    for start in range(0, hidden, BLOCK_H):
        h = start + tl.arange(0, BLOCK_H)
        x = tl.load(x_ptr + tokens.to(tl.int64)[:, None] * hidden + h[None, :],
                    mask=live[:, None] & (h < hidden)[None, :], other=0.0).to(tl.float32)
        squares += tl.sum(x * x, 1)
    return 1.0 / tl.sqrt(squares / hidden + eps)
