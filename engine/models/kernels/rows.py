"""Each row's 1 / rms, for the kernels that read a product whose input's RMS norm was folded into it
(engine/models/layers.py, `RMSNorm.fold_into`).  The norm's per-row scale commutes with the product, so
the kernel reading the product applies it, and no norm kernel runs before the product."""
from __future__ import annotations

import torch

from engine.models.kernels.jit import tl


def row_inputs(normed: torch.Tensor | None, rows: int, stand_in: torch.Tensor) -> tuple[torch.Tensor, int]:
    """What a kernel's x_ptr and `hidden` take: the product's input rows (contiguous, `rows` of them) and
    their width; without them, `stand_in` for a pointer the kernel never reads (SCALED off) and width 1."""
    if normed is None:
        return stand_in, 1
    normed = normed.contiguous()
    assert normed.numel() == rows * normed.shape[-1]
    return normed, normed.shape[-1]


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
