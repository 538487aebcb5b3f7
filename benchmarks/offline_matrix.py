"""Offline throughput per matrix cell: engine start, frames/s and audio-s/s for one batch.

    python benchmarks/offline_matrix.py --platform cuda --preset 0.6b --batch 64
    python benchmarks/offline_matrix.py --platform cpu --batch 8
    python benchmarks/offline_matrix.py --platform cpu --batch 8 --backend torch --backend vllm --runner v1

Prints a Markdown table.  Each cell starts its own engine (CUDA graph capture, or vLLM's
start-up, is part of the start time), runs one warm-up request, then times a steady level
(benchmarks/workload.py) with `--batch` requests running at once.  A
cell vLLM refuses here is listed with vLLM's reason.
"""
from __future__ import annotations

import argparse
import time

from ci.matrix import CUDA_GRAPH, HANDOFFS, RUNNERS, cells
from engine.profile.resolve import resolve
from engine.profile.schema import BACKENDS
from engine.runtime.engine import TTSEngine
from engine.request import SpeechRequest
from engine.stage0.vllm_backend import unsupported
from engine.process.tree import unwind_on_sigterm
from codec_cost import codec_cost   # this script's folder is on sys.path when run
from results import record
from workload import TEXTS, level_done, min_requests, summarize


def cell_profile(cell, args):
    overrides = cell.overrides + [f"model.preset={args.preset}", f"model.dtype={args.dtype}",
                                  f"stages.0.max_num_seqs={args.batch}"]
    return resolve("qwen3_tts", platform=args.platform, overrides=overrides + args.overrides)


def bench_cell(profile, args, cost: dict) -> dict:
    """One steady level: generate() calls of 10 x batch requests of the committed texts (the engine keeps
    `batch` of them running) until the level has run 30 s."""
    t0 = time.perf_counter()
    with TTSEngine(profile) as engine:
        start_s = time.perf_counter() - t0
        engine.generate([SpeechRequest("Warm up the kernels.", seed=0)])
        results, t0 = [], time.perf_counter()
        while not level_done(len(results), time.perf_counter() - t0, args.batch):
            n = len(results)
            results += engine.generate([SpeechRequest(TEXTS[i % len(TEXTS)], voice="ryan", seed=i)
                                        for i in range(n, n + min_requests(args.batch))])
        wall = time.perf_counter() - t0
        info = engine.info[0]
    assert all(r.ok for r in results), [r.error for r in results if not r.ok][:1]
    frames = sum(len(r.codes) for r in results)
    level = summarize([(r.timings["first_audio_s"], r.timings["total_s"], r.duration_s) for r in results], wall)
    return {**level, **cost, "cell": profile.cell, "start_s": start_s, "captured": info.get("captured", []),
            "frames": frames, "frames_per_s": frames / wall, "mode": "offline", "runner": info["runner"],
            "cuda_graph": "on" if info["graphs"] else "off", "concurrency": args.batch}


def model_args(ap: argparse.ArgumentParser, text_bytes: int | None = None) -> None:
    """What every engine benchmark is asked: where it runs, which model in which dtype, how big a batch."""
    ap.add_argument("--platform", default=None)
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--batch", type=int, default=8)
    if text_bytes is not None:   # the level benchmarks send the committed texts instead
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
    unwind_on_sigterm()   # stopped early, what this started ends with it
    rows, cost = [], codec_cost(args.preset)
    print(f"preset={args.preset} dtype={args.dtype} batch={args.batch}; codec {cost['codec_gmac_per_audio_s']:.1f} "
          f"GMAC per audio second, {cost['codec_params_m']:.1f}M parameters; {len(TEXTS)} texts")
    print("| cell | start s | captured sizes | requests | level wall s | frames/s | audio-s/s | first audio p50 ms | "
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
        row = bench_cell(profile, args, cost)
        rows.append(row)
        print(f"| {row['cell']} | {row['start_s']:.1f} | {row['captured'] or '-'} | {row['requests']} | "
              f"{row['wall_s']:.1f} | {row['frames_per_s']:.0f} | {row['audio_s_per_s']:.1f} | "
              f"{row['ttfp_p50_ms']:.0f} | {row['rtf_mean']:.2f} |", flush=True)
    if args.json:
        # The results file's rows are the built-in engine's (its key has no backend); vLLM cells are printed only.
        record(args.json, [r for r in rows if r["cell"].split("-")[0] != "vllm"], args.platform)


if __name__ == "__main__":
    main()
