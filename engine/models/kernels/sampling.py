"""Sampling of one token per row without a sort: the same draw as engine/stage0/sampling.py's `sample`."""
from __future__ import annotations

import torch

from engine.models.kernels.jit import compiled, tl, triton


# -- sampling: temperature, top-k, top-p and the inverse-CDF draw of one row per program, without a sort

def _sample_kernel(logits_ptr, stride, rows_ptr, temperature_ptr, top_k_ptr, top_p_ptr, u_ptr, u_stride, codebook,
                   out_ptr, vocab, table_ptr, embed_ptr, embed_stride, hidden, BLOCK: tl.constexpr,
                   EMBED: tl.constexpr, HIDDEN: tl.constexpr):
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
    # float32 -> int32 keys in the same order: the sign-magnitude bits folded into two's complement (inline:
    # a compiled kernel calls only other compiled functions)
    bits = x.to(tl.int32, bitcast=True)
    key = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
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
    token = tl.where(temperature > 0, picked.to(tl.int64), greedy.to(tl.int64))
    tl.store(out_ptr + r, token)
    if EMBED:   # the token's row of the next pass's embedding table, where that pass reads its input
        cols = tl.arange(0, HIDDEN)
        row = tl.load(table_ptr + token * hidden + cols, mask=cols < hidden)
        tl.store(embed_ptr + r.to(tl.int64) * embed_stride + cols, row, mask=cols < hidden)


def sample(logits: torch.Tensor, rows: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
           top_p: torch.Tensor, u: torch.Tensor, codebook: int,
           embed: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """One token per row of logits [R, V]; row r's parameters and uniforms are those of slot rows[r].
    With embed (table [V', H], into [R, H]), row r's token's table row is also written to into[r]."""
    out = torch.empty(logits.shape[0], dtype=torch.long, device=logits.device)
    table, into = embed if embed is not None else (out, out)
    assert embed is None or (table.is_contiguous() and into.stride(-1) == 1)
    hidden = table.shape[-1] if embed is not None else 1
    compiled(_sample_kernel)[(logits.shape[0],)](
        logits, logits.stride(0), rows, temperature, top_k, top_p, u, u.stride(0), codebook, out, logits.shape[1],
        table, into, into.stride(0), hidden, BLOCK=triton.next_power_of_2(logits.shape[1]), EMBED=embed is not None,
        HIDDEN=triton.next_power_of_2(hidden), num_warps=8)
    return out
