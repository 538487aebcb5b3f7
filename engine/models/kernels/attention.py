"""A decode step's attention over runner v2's static KV buffers, in one kernel where the eager path
runs about twenty: q and k normed per head and rotated, this step's keys and values written into the
cache rows, and attention over each row's own positions (no mask tensor, no repeated kv heads, no
transposes).  The eager path is engine/models/layers.py's Attention with a StaticView.

Where the layer's input norm was folded into the q/k/v product (`RMSNorm.fold_into`), the product ran on
the unnormed rows, and this kernel scales each token's q, k and v by 1 / rms of its input row as it reads
them (engine/models/kernels/rows.py): the norm's kernel before the product is saved.  Each row's scale is
computed once a program, for this step's tokens, and the queries take theirs from it."""
from __future__ import annotations

import torch

from engine.models.kernels.jit import compiled, tl, triton
from engine.models.kernels.rows import _row_scale, row_inputs


def _decode_kernel(qkv_ptr, x_ptr, q_norm_ptr, k_norm_ptr, cos_ptr, sin_ptr, pos_ptr, pos_row, pos_step, k_cache_ptr,
                   v_cache_ptr, out_ptr, first_row, steps, heads, key_len, row_stride, pos_stride, eps, scale,
                   hidden, x_eps, SCALED: tl.constexpr, BLOCK_H: tl.constexpr,
                   G: tl.constexpr, M: tl.constexpr, S: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr):
    """One program per (row, kv head).  Its kv head's keys and values of this step go into the cache, then
    its G query heads' queries, as the M rows of a matrix (padded to what a matrix product takes), attend
    over the row's keys up to each query's position."""
    b = tl.program_id(0)
    kv = tl.program_id(1)
    d = tl.arange(0, D)
    partner = (d + D // 2) % D   # rotation pairs d with the other half's d
    width = (heads + 2 * (heads // G)) * D   # a token's q, k and v
    row = (first_row + b).to(tl.int64) * row_stride + kv * D

    # this step's keys (normed, rotated) and values, into the cache
    s = tl.arange(0, S)
    here = s < steps
    k_pos = tl.load(pos_ptr + b * pos_row + s * pos_step, mask=here, other=0)
    k_scale = _row_scale(x_ptr, b * steps + s, here, hidden, x_eps, SCALED, S, BLOCK_H)
    src = qkv_ptr + (b * steps + s).to(tl.int64)[:, None] * width + (heads + kv) * D
    new_k = _normed_rotated(src, k_scale, k_norm_ptr, cos_ptr, sin_ptr, k_pos, here, d, partner, eps, D)
    at = row + k_pos.to(tl.int64)[:, None] * pos_stride + d[None, :]
    tl.store(k_cache_ptr + at, new_k.to(k_cache_ptr.dtype.element_ty), mask=here[:, None])
    new_v = tl.load(src + (heads // G) * D + d[None, :], mask=here[:, None], other=0.0).to(tl.float32)
    tl.store(v_cache_ptr + at, (new_v * k_scale[:, None]).to(v_cache_ptr.dtype.element_ty), mask=here[:, None])
    tl.debug_barrier()   # the loop below reads what this program's threads just wrote

    m = tl.arange(0, M)
    live = m < steps * G
    token = b * steps + m // G
    head = kv * G + m % G
    q_pos = tl.load(pos_ptr + b * pos_row + (m // G) * pos_step, mask=live, other=-1)
    # each query's token is one of this step's: its row's scale is k_scale's, picked out, not loaded again
    q_scale = tl.sum(tl.where((m // G)[:, None] == s[None, :], k_scale[None, :], 0.0), 1)
    src = qkv_ptr + token.to(tl.int64)[:, None] * width + head[:, None] * D
    q = _normed_rotated(src, q_scale, q_norm_ptr, cos_ptr, sin_ptr, q_pos, live, d, partner, eps, D)
    q = q.to(k_cache_ptr.dtype.element_ty)
    end = tl.minimum(tl.max(q_pos, 0) + 1, key_len)
    best = tl.full((M,), float("-inf"), tl.float32)
    total = tl.zeros((M,), tl.float32)
    acc = tl.zeros((M, D), tl.float32)
    for start in range(0, end, BLOCK):
        n = start + tl.arange(0, BLOCK)
        inside = n < end
        block_at = row + n.to(tl.int64)[:, None] * pos_stride + d[None, :]
        keys = tl.load(k_cache_ptr + block_at, mask=inside[:, None], other=0.0)
        values = tl.load(v_cache_ptr + block_at, mask=inside[:, None], other=0.0)
        scores = tl.dot(q, tl.trans(keys)).to(tl.float32) * scale
        scores = tl.where(inside[None, :] & (n[None, :] <= q_pos[:, None]), scores, float("-inf"))
        new_best = tl.maximum(best, tl.max(scores, 1))
        shift = tl.where(new_best == float("-inf"), 0.0, new_best)   # a row that sees nothing yet
        p = tl.exp(scores - shift[:, None])
        keep = tl.exp(best - shift)
        total = total * keep + tl.sum(p, 1)
        acc = acc * keep[:, None] + tl.dot(p.to(values.dtype), values).to(tl.float32)
        best = new_best
    out = acc / tl.where(total == 0.0, 1.0, total)[:, None]
    tl.store(out_ptr + (token.to(tl.int64) * heads + head)[:, None] * D + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=live[:, None])


def _normed_rotated(src, row_scale, norm_ptr, cos_ptr, sin_ptr, pos, live, d, partner, eps, D: tl.constexpr):
    """Heads [R, D] at src (row pointers), times their rows' scales [R], RMS-normed and turned by their
    positions' angles: the rotary tables' rows hold both halves' cosines, and the sines with the first
    half's negated."""
    x = tl.load(src + d[None, :], mask=live[:, None], other=0.0).to(tl.float32) * row_scale[:, None]
    x_partner = tl.load(src + partner[None, :], mask=live[:, None], other=0.0).to(tl.float32) * row_scale[:, None]
    scale = 1.0 / tl.sqrt(tl.sum(x * x, 1) / D + eps)
    y = x * scale[:, None] * tl.load(norm_ptr + d).to(tl.float32)[None, :]
    y_partner = x_partner * scale[:, None] * tl.load(norm_ptr + partner).to(tl.float32)[None, :]
    angles = pos.to(tl.int64)[:, None] * D + d[None, :]
    return y * tl.load(cos_ptr + angles, mask=live[:, None], other=0.0) \
        + y_partner * tl.load(sin_ptr + angles, mask=live[:, None], other=0.0)


def decode_attention(qkv: torch.Tensor, q_norm: torch.Tensor, k_norm: torch.Tensor, eps: float,
                     rope_tables: tuple[torch.Tensor, torch.Tensor], k_cache: torch.Tensor, v_cache: torch.Tensor,
                     first_row: int, positions: torch.Tensor, key_len: int, heads: int, kv_heads: int,
                     normed: torch.Tensor | None = None, norm_eps: float = 0.0) -> torch.Tensor:
    """Attention of rows first_row.. of one layer's cache [slots, positions, kv_heads, D], for queries at
    positions [B, S] (each row's own, increasing), from the q/k/v product qkv [B, S, (heads + 2 kv_heads) D]:
    [B, S, heads * D].  This step's keys and values are written into the cache first.  With `normed` (the
    product's input [B, S, hidden], whose RMS norm was folded into it), q, k and v are first scaled by
    1 / rms of their row, with norm_eps."""
    b, s = positions.shape
    d = k_cache.shape[-1]
    assert k_cache.stride(-1) == 1 and k_cache.stride(-2) == d and v_cache.stride() == k_cache.stride()
    qkv = qkv.contiguous()
    x, hidden = row_inputs(normed, b * s, qkv)
    out = torch.empty(b, s, heads, d, dtype=qkv.dtype, device=qkv.device)
    cos, sin = rope_tables
    group = heads // kv_heads
    block_h = min(max(1024 // triton.next_power_of_2(s), 64), triton.next_power_of_2(hidden))
    compiled(_decode_kernel, _row_scale, _normed_rotated)[(b, kv_heads)](
        qkv, x, q_norm, k_norm, cos, sin, positions, positions.stride(0), positions.stride(1), k_cache, v_cache,
        out, first_row, s, heads, key_len, k_cache.stride(0), k_cache.stride(1), eps, d ** -0.5, hidden, norm_eps,
        SCALED=normed is not None, BLOCK_H=block_h, G=group, M=max(16, triton.next_power_of_2(s * group)),
        S=triton.next_power_of_2(s), D=d, BLOCK=min(64, max(16, triton.next_power_of_2(key_len))))
    return out.view(b, s, heads * d)
