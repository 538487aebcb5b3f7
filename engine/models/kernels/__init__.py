"""Fused kernels (Triton) for the hot spots of a frame step and of a codec pass.

A frame step at C64 ran about 3,600 CUDA kernels, most of them a few microseconds of
elementwise work (README, "The frame step", counts them with these); a codec pass spent two
thirds of its time on elementwise passes over activations of up to a hundred megabytes.  Each function
here does in one kernel what the eager code beside it does in many, and computes the same function:
`sample` the same tokens as engine/stage0/sampling.py's `sample` (up to ties at the top-p edge and float
summation order), `snake` SnakeBeta into a causal conv's padded input, `pointwise_residual` a codec
residual unit's 1x1 conv and add, `decode_attention` a layer's Attention over a StaticView, `swiglu`
SwiGLU's activation (with the RMS norm of the product's input, where that norm was folded into it).

They run where `use(x)` says: on CUDA when Triton is importable, and on the CPU under
Triton's interpreter (TRITON_INTERPRET=1), which is how the CPU tests hold them to the
eager code.  `LANEKEEPER_KERNELS=torch` or `unfused()` turns them off, to measure or
compare against the eager path.  Kernels are compiled on first use, under the
environment of that moment.
"""
from engine.models.kernels.jit import unfused, use
from engine.models.kernels.codec import snake, pointwise_residual
from engine.models.kernels.elementwise import swiglu
from engine.models.kernels.sampling import sample
from engine.models.kernels.attention import decode_attention

__all__ = ["decode_attention", "sample", "snake", "pointwise_residual", "swiglu", "unfused", "use"]
