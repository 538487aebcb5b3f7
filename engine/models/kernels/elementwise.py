"""SwiGLU's activation in one pass, and with it the RMS norm of a product's input when that norm's scale
was folded into the product (engine/models/layers.py, `RMSNorm.fold_into`)."""
from __future__ import annotations

import torch

from engine.models.kernels.jit import compiled, tl, triton
from engine.models.kernels.rows import _row_scale, row_inputs


# -- SwiGLU's activation: silu(gate) * up from the gate_up product [..., 2I]; SCALED, both halves first
# multiplied by 1 / rms(x) of the product's input row (the norm, applied after the product it commutes with:
# engine/models/kernels/rows.py)

def _swiglu_kernel(gate_up_ptr, x_ptr, out_ptr, inter, hidden, eps, SCALED: tl.constexpr, BLOCK: tl.constexpr,
                   BLOCK_H: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < inter
    gate = tl.load(gate_up_ptr + row * 2 * inter + offs, mask=inside, other=0.0).to(tl.float32)
    up = tl.load(gate_up_ptr + row * 2 * inter + inter + offs, mask=inside, other=0.0).to(tl.float32)
    one = tl.arange(0, 1)
    scale = tl.sum(_row_scale(x_ptr, row + one, one < 1, hidden, eps, SCALED, 1, BLOCK_H), 0)
    gate, up = gate * scale, up * scale
    tl.store(out_ptr + row * inter + offs, (gate * tl.sigmoid(gate) * up).to(out_ptr.dtype.element_ty), mask=inside)


def swiglu(gate_up: torch.Tensor, normed: torch.Tensor | None = None, eps: float = 0.0) -> torch.Tensor:
    """silu(gate) * up of gate_up [..., 2I]; with `normed` (the product's input rows [..., hidden]), of
    gate_up / rms(row): what the product of the RMS-normed rows would have given."""
    gate_up = gate_up.contiguous()
    inter = gate_up.shape[-1] // 2
    out = torch.empty(*gate_up.shape[:-1], inter, dtype=gate_up.dtype, device=gate_up.device)
    rows = gate_up.numel() // gate_up.shape[-1]
    x, hidden = row_inputs(normed, rows, gate_up)
    block = 1024
    compiled(_swiglu_kernel, _row_scale)[(rows, triton.cdiv(inter, block))](
        gate_up, x, out, inter, hidden, eps, SCALED=normed is not None,
        BLOCK=block, BLOCK_H=min(1024, triton.next_power_of_2(hidden)))
    return out
