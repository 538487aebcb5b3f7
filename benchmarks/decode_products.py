"""A decode step's products on this GPU, a call at a time, replayed from CUDA graphs as a frame step
replays them: each with its RMS norm run as a kernel before it, and with the norm folded into the
product's weight (RMSNorm.fold_into), the row scale then applied by the kernel that reads the product.

    python benchmarks/decode_products.py --preset 0.6b --rows 64 128

Rows: q/k/v with the attention kernel after it, and gate/up with SwiGLU's activation, for the preset's
talker, in microseconds a call; the README's frame-step section quotes them.
"""
from __future__ import annotations

import argparse
import copy

import torch

from engine.models.kv_cache import StaticKV
from engine.models.layers import DecoderLayer, Rotary
from engine.models.presets import PRESETS


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
    ap.add_argument("--position", type=int, default=150, help="the rows' position in their KV cache")
    args = ap.parse_args()
    shape = PRESETS[args.preset].talker
    torch.manual_seed(0)
    layer = DecoderLayer(shape, 0).to("cuda", torch.bfloat16)
    with torch.no_grad():
        for norm in (layer.input_norm, layer.post_norm):
            norm.weight.uniform_(0.5, 1.5)
    folded = copy.deepcopy(layer)
    folded.fold_norms()
    rotary = Rotary(shape.head_dim, shape.rope_theta, 4096).to("cuda")
    print(f"{args.preset}: hidden {shape.hidden}, bf16, {torch.cuda.get_device_name(0)}\n")
    print("| product | rows | norm as a kernel, us | folded, us |\n| --- | --- | --- | --- |")
    for rows in args.rows:
        x = torch.randn(rows, 1, shape.hidden, device="cuda", dtype=torch.bfloat16) * 3
        positions = torch.full((rows, 1), args.position, device="cuda")
        kv = StaticKV(1, rows, 256, shape.kv_heads, shape.head_dim, torch.bfloat16, torch.device("cuda"))
        view = kv.view(0, positions, 256)
        rope = rotary(positions, torch.bfloat16)
        with torch.no_grad():
            attn = [graphed_us(lambda m=m: m.attn(x.clone(), m.input_norm, rope, view)) for m in (layer, folded)]
            mlp = [graphed_us(lambda m=m: m.mlp(x.clone(), m.post_norm)) for m in (layer, folded)]
        for name, (plain, fold) in (("q/k/v, attention, o", attn), ("gate/up, SwiGLU, down", mlp)):
            print(f"| {name} | {rows} | {plain:.1f} | {fold:.1f} |")


if __name__ == "__main__":
    main()
