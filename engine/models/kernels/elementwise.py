"""SwiGLU's activation in one pass."""
from __future__ import annotations

import torch

from engine.models.kernels.jit import compiled, tl, triton


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
