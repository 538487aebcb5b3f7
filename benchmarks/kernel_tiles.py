"""Tiles for the fused norm-and-product kernel (engine/models/kernels/linear.py) on this GPU.

    python benchmarks/kernel_tiles.py --preset 0.6b --rows 64 128

For the decode products of the preset's talker (q/k/v, and gate/up with SwiGLU), at each row count:
microseconds a call of the eager path (RMS norm, cuBLAS's product, SwiGLU's kernel) and of the fused
kernel at each candidate tile, all replayed from CUDA graphs as a frame step replays them.  The kernel's
TILES should be the fastest row at the batch sizes the engine serves.
"""
from __future__ import annotations

import argparse
import itertools

import torch

from engine.models import kernels
from engine.models.kernels import linear
from engine.models.layers import RMSNorm, normed_linear
from engine.models.presets import PRESETS

CANDIDATES = [dict(BLOCK_N=n, BLOCK_K=k, num_warps=w, num_stages=s)
              for n, k, w, s in itertools.product((16, 32, 64), (64, 128), (4,), (3, 4))] + [
    dict(BLOCK_N=32, BLOCK_K=256, num_warps=4, num_stages=3), dict(BLOCK_N=64, BLOCK_K=128, num_warps=8, num_stages=3)]


def graphed_us(fn, calls: int = 20, replays: int = 50) -> float:
    """Microseconds a call, from a graph of `calls` calls replayed `replays` times."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / (calls * replays)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="0.6b")
    ap.add_argument("--rows", type=int, nargs="+", default=[64, 128])
    args = ap.parse_args()
    shape = PRESETS[args.preset].talker
    norm = RMSNorm(shape.hidden).to("cuda", torch.bfloat16)
    products = {"q/k/v": ((shape.heads + 2 * shape.kv_heads) * shape.head_dim, False),
                "gate/up + SwiGLU": (2 * shape.intermediate, True)}
    print(f"{args.preset}: hidden {shape.hidden}, bf16, {torch.cuda.get_device_name(0)}\n")
    print("| product | rows | path | us a call |\n| --- | --- | --- | --- |")
    chosen = dict(linear.TILES)
    for (name, (cols, gated)), rows in itertools.product(products.items(), args.rows):
        weight = torch.randn(cols, shape.hidden, device="cuda", dtype=torch.bfloat16) / shape.hidden ** 0.5
        x = torch.randn(rows, 1, shape.hidden, device="cuda", dtype=torch.bfloat16)
        with kernels.unfused():
            print(f"| {name} | {rows} | eager | {graphed_us(lambda: normed_linear(x, norm, weight, gated)):.1f} |")
        timed = []
        for tiles in CANDIDATES:
            linear.TILES.clear(), linear.TILES.update(tiles)
            try:
                timed.append((graphed_us(lambda: kernels.norm_linear(x, norm.weight, norm.eps, weight, gated)), tiles))
            except Exception as exc:   # a tile that does not fit the GPU's shared memory, say
                print(f"| {name} | {rows} | {tiles} | failed: {type(exc).__name__} |")
        for us, tiles in sorted(timed, key=lambda t: t[0])[:5]:
            print(f"| {name} | {rows} | fused {tiles}{' (TILES)' if tiles == chosen else ''} | {us:.1f} |")
        linear.TILES.clear(), linear.TILES.update(chosen)
        print(f"| {name} | {rows} | fused, TILES | "
              f"{graphed_us(lambda: kernels.norm_linear(x, norm.weight, norm.eps, weight, gated)):.1f} |")


if __name__ == "__main__":
    main()
