"""Offline throughput per matrix cell: engine start, frames/s and audio-s/s for one batch.

    python benchmarks/offline_matrix.py --platform cuda --preset 0.6b --batch 64
    python benchmarks/offline_matrix.py --platform cpu --batch 8
    python benchmarks/offline_matrix.py --platform cpu --batch 8 --backend torch --backend vllm --runner v1

Prints a Markdown table.  Each cell starts its own engine (CUDA graph capture, or vLLM's
start-up, is part of the start time), runs one warm-up request, then times one batch.  A
cell vLLM refuses here is listed with vLLM's reason.
"""
from __future__ import annotations

import argparse
import statistics
import time

from ci.matrix import CUDA_GRAPH, HANDOFFS, RUNNERS, cells
from engine.profile.resolve import resolve
from engine.profile.schema import BACKENDS
from engine.runtime.engine import TTSEngine
from engine.request import SpeechRequest
from engine.stage0.vllm_backend import unsupported
from results import percentile, record   # this script's folder is on sys.path when run


def cell_profile(cell, args):
    overrides = cell.overrides + [f"model.preset={args.preset}", f"model.dtype={args.dtype}",
                                  f"stages.0.max_num_seqs={args.batch}"]
    return resolve("qwen3_tts", platform=args.platform, overrides=overrides + args.overrides)


def bench_cell(profile, args) -> dict:
    t0 = time.perf_counter()
    with TTSEngine(profile) as engine:
        start_s = time.perf_counter() - t0
        engine.generate([SpeechRequest("Warm up the kernels.", seed=0)])
        text = "x" * args.text_bytes
        requests = [SpeechRequest(text, voice="ryan", seed=i) for i in range(args.batch)]
        t0 = time.perf_counter()
        results = engine.generate(requests)
        wall = time.perf_counter() - t0
        info = engine.info[0]
    assert all(r.ok for r in results), [r.error for r in results if not r.ok][:1]
    frames = sum(len(r.codes) for r in results)
    audio = sum(r.duration_s for r in results)
    ttfa = [1000 * r.timings["first_audio_s"] for r in results]
    return {"cell": profile.cell, "start_s": start_s, "captured": info.get("captured", []), "wall_s": wall,
            "frames": frames, "frames_per_s": frames / wall, "audio_s_per_s": audio / wall,
            "mode": "offline", "runner": info["runner"], "cuda_graph": "on" if info["graphs"] else "off",
            "concurrency": len(requests), "ttfp_p50_ms": percentile(ttfa, 0.5), "ttfp_p99_ms": percentile(ttfa, 0.99),
            "rtf_mean": statistics.mean(r.timings["total_s"] / r.duration_s for r in results)}


def model_args(ap: argparse.ArgumentParser, text_bytes: int = 60) -> None:
    """What every engine benchmark is asked: where it runs, which model in which dtype, how big a batch."""
    ap.add_argument("--platform", default=None)
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--text-bytes", type=int, default=text_bytes, help="input length; frames = 0.8 * bytes + 2")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    model_args(ap)
    ap.add_argument("--runner", action="append")
    ap.add_argument("--cuda-graph", action="append")
    ap.add_argument("--handoff", action="append")
    ap.add_argument("--backend", action="append", choices=BACKENDS)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--json", help="also merge the rows into this results file (benchmarks/results.py)")
    args = ap.parse_args()
    rows = []
    print(f"preset={args.preset} dtype={args.dtype} batch={args.batch} text_bytes={args.text_bytes}")
    print("| cell | start s | captured sizes | batch wall s | frames | frames/s | audio-s/s | first audio p50 ms | "
          "mean RTF |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    chosen = [c for backend in args.backend or ["torch"]
              for c in cells(args.runner or RUNNERS, args.cuda_graph or CUDA_GRAPH, args.handoff or HANDOFFS, backend)]
    for cell in chosen:
        profile = cell_profile(cell, args)
        why = unsupported(profile) if cell.backend == "vllm" else None
        if why:
            print(f"| {cell.id} | skipped: {why} |", flush=True)
            continue
        row = bench_cell(profile, args)
        rows.append(row)
        print(f"| {row['cell']} | {row['start_s']:.1f} | {row['captured'] or '-'} | {row['wall_s']:.2f} | "
              f"{row['frames']} | {row['frames_per_s']:.0f} | {row['audio_s_per_s']:.1f} | "
              f"{row['ttfp_p50_ms']:.0f} | {row['rtf_mean']:.2f} |", flush=True)
    if args.json:
        # The results file's rows are the built-in engine's (its key has no backend); vLLM cells are printed only.
        record(args.json, [r for r in rows if r["cell"].split("-")[0] != "vllm"], args.platform)


if __name__ == "__main__":
    main()
