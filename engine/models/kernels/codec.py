"""The codec's upsampling stack, time-major ([B, T, C], channels last): SnakeBeta written straight into
the next causal conv's left-padded input, and a residual unit's 1x1 conv with its bias and the residual
add as one matrix-product kernel.

In a pass of the real-sized codec the convolutions themselves took about a third of the time; the rest
was elementwise: cuDNN turning [B, C, T] into channels-last and back around every conv, copies of
the causal convs' cropped outputs, bias adds, SnakeBeta and the residual adds, each a full pass over
activations of up to a hundred megabytes.  Here each activation is written once and read by the
next product.  (SnakeBeta inside the 1x1 product's kernel was slower: each of its column tiles
recomputed the sines.)

A bias a product left out (`bias`, `x_bias`) is added where its output is next read, per channel: cuDNN
adds a conv's bias in a pass of its own.
"""
from __future__ import annotations

import torch

from engine.models.kernels.jit import compiled, tl, triton


def _snake_kernel(x_ptr, bias_ptr, log_alpha_ptr, log_beta_ptr, out_ptr, length, channels, pad, rows, x_batch, x_row,
                  HAS_BIAS: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr):
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)   # rows of the output: pad zeros, length, zeros
    b = tl.program_id(1).to(tl.int64)
    c = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_in = c < channels
    src = t - pad
    inside = ((src >= 0) & (src < length))[:, None] & c_in[None, :]
    x = tl.load(x_ptr + b * x_batch + src.to(tl.int64)[:, None] * x_row + c[None, :], mask=inside,
                other=0.0).to(tl.float32)
    if HAS_BIAS:
        x += tl.load(bias_ptr + c, mask=c_in, other=0.0).to(tl.float32)[None, :]
    alpha = tl.exp(tl.load(log_alpha_ptr + c, mask=c_in, other=0.0).to(tl.float32))
    inv_beta = 1.0 / (tl.exp(tl.load(log_beta_ptr + c, mask=c_in, other=0.0).to(tl.float32)) + 1e-9)
    s = tl.sin(x * alpha[None, :])
    y = tl.where(inside, x + s * s * inv_beta[None, :], 0.0)
    tl.store(out_ptr + (b * rows + t.to(tl.int64)[:, None]) * channels + c[None, :], y.to(out_ptr.dtype.element_ty),
             mask=(t < rows)[:, None] & c_in[None, :])


def snake(x: torch.Tensor, log_alpha: torch.Tensor, log_beta: torch.Tensor, bias: torch.Tensor | None = None,
          pad: int = 0, rows: int | None = None) -> torch.Tensor:
    """SnakeBeta of x (+ bias) [B, T, C], returned as [B, rows, C] (pad + T unless longer) with `pad` zero
    rows ahead and zeros after: the input of a causal conv reaching `pad` samples back.  x may be a view
    with any batch and row stride."""
    if x.stride(2) != 1:
        x = x.contiguous()
    b, t, c = x.shape
    rows = pad + t if rows is None else rows
    out = torch.empty(b, rows, c, dtype=x.dtype, device=x.device)
    block_c = min(128, triton.next_power_of_2(c))
    block_t = 2048 // block_c
    grid = (triton.cdiv(rows, block_t), b, triton.cdiv(c, block_c))
    compiled(_snake_kernel)[grid](x, bias if bias is not None else x, log_alpha, log_beta, out, t, c, pad, rows,
                                  x.stride(0), x.stride(1), HAS_BIAS=bias is not None, BLOCK_T=block_t,
                                  BLOCK_C=block_c)
    return out


def _pointwise_kernel(z_ptr, w_ptr, w_bias_ptr, x_ptr, x_bias_ptr, out_ptr, length, channels, x_batch, x_row,
                      HAS_X_BIAS: tl.constexpr, PRECISION: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    t = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    b = tl.program_id(1).to(tl.int64)
    n = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)
    t_in, n_in = t < length, n < channels
    rows = (b * length + t.to(tl.int64))[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, channels, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_in = k < channels
        a = tl.load(z_ptr + rows * channels + k[None, :], mask=t_in[:, None] & k_in[None, :], other=0.0)
        w = tl.load(w_ptr + n[None, :] * channels + k[:, None], mask=k_in[:, None] & n_in[None, :], other=0.0)
        acc = tl.dot(a, w, acc, input_precision=PRECISION)
    acc += tl.load(w_bias_ptr + n, mask=n_in, other=0.0).to(tl.float32)[None, :]
    inside = t_in[:, None] & n_in[None, :]
    residual = tl.load(x_ptr + b * x_batch + t.to(tl.int64)[:, None] * x_row + n[None, :], mask=inside, other=0.0)
    acc += residual.to(tl.float32)
    if HAS_X_BIAS:
        acc += tl.load(x_bias_ptr + n, mask=n_in, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + rows * channels + n[None, :], acc.to(out_ptr.dtype.element_ty), mask=inside)


def pointwise_residual(z: torch.Tensor, weight: torch.Tensor, w_bias: torch.Tensor, x: torch.Tensor,
                       x_bias: torch.Tensor | None = None) -> torch.Tensor:
    """x (+ x_bias) + z @ weight^T + w_bias over [B, T, C]: a residual unit's 1x1 conv and residual add.
    z is contiguous; x (the unit's input) may be a view with any batch and row stride."""
    z, weight = z.contiguous(), weight.reshape(weight.shape[0], -1).contiguous()
    if x.stride(2) != 1:
        x = x.contiguous()
    b, t, c = z.shape
    out = torch.empty_like(z)
    block_n = max(16, min(128, c & -c))   # the largest power of two dividing C, so that no tile is ragged
    grid = (triton.cdiv(t, 128), b, triton.cdiv(c, block_n))
    compiled(_pointwise_kernel)[grid](z, weight, w_bias, x, x_bias if x_bias is not None else w_bias, out, t, c,
                                      x.stride(0), x.stride(1), HAS_X_BIAS=x_bias is not None,
                                      PRECISION="ieee" if z.dtype == torch.float32 else "tf32",
                                      BLOCK_M=128, BLOCK_N=block_n, BLOCK_K=min(64, block_n))
    return out
