"""How fast the codec decodes the streamed window shape on its own: one pass over `rows` windows
of left context plus a chunk (97 frames with the shipped chunking), captured in a CUDA graph as
stage 1 captures it, and replayed.  Prints audio seconds decoded per second for each row count,
with cuDNN's algorithm timing off and on, then the torch profiler's top kernels of one pass.

    python benchmarks/codec_speed.py --preset 0.6b --dtype bfloat16

Streaming re-decodes each frame's context, so a stream of N audio seconds costs about
(72 + 25) / 25 = 3.9 N seconds decoded here.
"""
from __future__ import annotations

import argparse
import time

import torch

from engine.models.build import build_models
from engine.models.graphs import GraphPool
from engine.models.presets import SAMPLE_RATE, SAMPLES_PER_FRAME
from engine.profile.resolve import resolve


def passes_per_second(codec, rows: int, frames: int, device: torch.device, repeats: int = 20) -> float:
    codes = torch.randint(0, 2048, (rows, frames, 16), device=device)
    pool = GraphPool(lambda: codec(codes, first_position=0), [()], device)
    pool()
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(repeats):
        pool()
    torch.cuda.synchronize(device)
    return repeats / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="0.6b")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16, 32])
    args = ap.parse_args()
    device = torch.device("cuda")
    connector = resolve("qwen3_tts").connector()
    frames = connector.codec_left_context_frames + connector.codec_chunk_frames
    codec = build_models(args.preset, parts=("codec",), device="cuda", dtype=args.dtype).codec
    window_s = frames * SAMPLES_PER_FRAME / SAMPLE_RATE
    print(f"{args.preset} {args.dtype}, windows of {frames} frames ({window_s:.2f} s)\n")
    print("| rows | cuDNN timing | ms a pass | audio-s decoded per s |\n| --- | --- | --- | --- |")
    for benchmark in (False, True):
        torch.backends.cudnn.benchmark = benchmark
        for rows in args.rows:
            rate = passes_per_second(codec, rows, frames, device)
            print(f"| {rows} | {'on' if benchmark else 'off'} | {1000 / rate:.2f} | {rate * rows * window_s:.0f} |")
    codes = torch.randint(0, 2048, (4, frames, 16), device=device)
    codec(codes)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        codec(codes)
        torch.cuda.synchronize(device)
    print("\n### one eager pass of 4 windows, top kernels by device time\n")
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=15, max_name_column_width=70))


if __name__ == "__main__":
    main()
