"""Where a stage-0 frame step's time goes: the torch talker in this process, one batch of requests.

The pinned command, whose figures the README and benchmarks/results/h200.json quote:

    python benchmarks/profile_step.py --platform cuda --preset 0.6b --dtype bfloat16 --batch 64 \
        --max-len 4096 --gpu-util 0.3 --text-bytes 100 --runner v2 --json benchmarks/results/h200.json

For each runner: the mean wall time of a frame step and where it went by stage 0's own clocks
(launching the step, admitting, waiting for the step ahead and reading it back, the handoff: the
parts the online benchmark reports, unsynced, so the step still runs ahead of its read-back); then
the same steps with a device sync around the running rows' frame (and inside it, when not captured,
codebook-0 sampling and the code predictor's 15 passes), and the torch profiler's top operators by
self device time and by self CPU time.  Prints Markdown; `--trace DIR` also writes Chrome traces.
A sync around the handoff would wait for the step in flight, so the handoff is timed by the clock only.

Kernels are counted from the profiler's device-side events, one per launch on the GPU: an
eager operator and the kernel it launched are one kernel, and a kernel replayed from a CUDA
graph is one too.  Copies and fills (memcpy, memset) are counted apart.
"""
from __future__ import annotations

import argparse
import time
from collections import defaultdict

import torch

from engine.profile.resolve import resolve
from engine.request import SpeechRequest
from engine.stage0.process import make_talker
from engine.stage0.talker import Talker
from offline_matrix import model_args   # this script's folder is on sys.path when run
from results import record_section


class Inbox(list):
    put = list.append


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def talker_for(args, runner: str) -> Talker:
    profile = resolve("qwen3_tts", platform=args.platform, overrides=[
        f"model_runner={runner}", f"model.preset={args.preset}", f"model.dtype={args.dtype}",
        f"stages.0.max_num_seqs={args.batch}", f"stages.0.enforce_eager={str(args.eager).lower()}",
        f"stages.0.max_model_len={args.max_len}", f"stages.0.gpu_memory_utilization={args.gpu_util}"])
    return make_talker(profile, Inbox(), Inbox())


def fill(talker, args):
    for i in range(args.batch):
        talker.add(SpeechRequest("x" * args.text_bytes, voice="ryan", seed=i, max_new_tokens=4 * args.steps))
    while talker.scheduler.waiting:   # admit (prefill) everything first: steps below are decode steps
        talker.step()


def timed_phases(talker, steps: int) -> dict[str, float]:
    """Seconds per phase, each wrapped in device syncs (so the sum is above an unsynced step)."""
    spent: dict[str, float] = defaultdict(float)
    runner, device = talker.backend.runner, talker.backend.device

    def wrap(obj, name, label):
        fn = getattr(obj, name)

        def timed(*a, **kw):
            sync(device)
            t0 = time.perf_counter()
            out = fn(*a, **kw)
            sync(device)
            spent[label] += time.perf_counter() - t0
            return out
        setattr(obj, name, timed)
        return fn

    saved = [(runner, "decode", wrap(runner, "decode", "running rows' frame (talker, sampling, code predictor)")),
             (runner.sampling, "first", wrap(runner.sampling, "first", "  of which codebook-0 sampling (uncaptured)")),
             (runner, "residual_codes", wrap(runner, "residual_codes", "  of which code predictor (uncaptured)"))]
    try:
        t0 = time.perf_counter()
        for _ in range(steps):
            talker.step()
        sync(device)
        spent["whole step (synced phases)"] = time.perf_counter() - t0
    finally:
        for obj, name, fn in saved:
            setattr(obj, name, fn)
    return {k: v / steps for k, v in spent.items()}


def timed_prefill(talker, k: int, repeats: int = 10) -> float:
    """Seconds to prefill k of the running requests' prompts again (their state is spent afterwards)."""
    seqs, runner, device = talker.scheduler.running[:k], talker.backend.runner, talker.backend.device
    runner.prefill(seqs)   # warm-up
    sync(device)
    t0 = time.perf_counter()
    for _ in range(repeats):
        runner.prefill(seqs)
    sync(device)
    return (time.perf_counter() - t0) / repeats


def device_work(prof, steps: int) -> dict[str, float]:
    """Kernels, copies and device milliseconds a step, each device-side event counted once."""
    device = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    copies = [e for e in device if e.name.startswith(("Memcpy", "Memset"))]
    return {"kernels": (len(device) - len(copies)) / steps, "copies": len(copies) / steps,
            "device_ms": sum(e.device_time_total for e in device) / steps / 1000}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    model_args(ap, text_bytes=100)
    ap.set_defaults(batch=64)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--max-len", type=int, default=4096)
    ap.add_argument("--gpu-util", type=float, default=0.3)
    ap.add_argument("--eager", action="store_true")
    ap.add_argument("--runner", action="append")
    ap.add_argument("--trace", help="directory for Chrome traces")
    ap.add_argument("--json", help="also write the frame step into this results file (benchmarks/results.py)")
    args = ap.parse_args()
    summary = {}
    for runner in args.runner or ["v1", "v2"]:
        talker = talker_for(args, runner)
        fill(talker, args)
        for _ in range(3):
            talker.step()   # warm-up
        sync(talker.backend.device)
        clock = dict(talker.clock.seconds)
        t0 = time.perf_counter()
        for _ in range(args.steps):
            talker.step()
        sync(talker.backend.device)
        step = (time.perf_counter() - t0) / args.steps
        print(f"\n## runner {runner}, batch {len(talker.scheduler.running)}, {args.preset} {args.dtype}, "
              f"{'eager' if args.eager else 'graphs'}: {1000 * step:.1f} ms a frame step "
              f"({len(talker.scheduler.running) / step:.0f} frames/s, {len(talker.scheduler.running) / step / 12.5:.1f} audio-s/s)\n")
        print("| part of the step (stage 0's clock) | ms a step |\n| --- | --- |")
        for part, seconds in talker.clock.seconds.items():
            if part == "inbox":   # timed by the stage's loop around the steps, which this script does not run
                continue
            print(f"| {part} | {1000 * (seconds - clock[part]) / args.steps:.2f} |")
        print("\n| phase, synced | ms a step |\n| --- | --- |")
        for name, s in timed_phases(talker, args.steps).items():
            print(f"| {name} | {1000 * s:.2f} |")
        activities = [torch.profiler.ProfilerActivity.CPU]
        if talker.backend.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities) as prof:
            for _ in range(5):
                talker.step()
            sync(talker.backend.device)
        if args.trace:
            prof.export_chrome_trace(f"{args.trace}/step-{runner}.json")
        if talker.backend.device.type == "cuda":
            counted = device_work(prof, 5)
            print(f"\n{counted['kernels']:.0f} CUDA kernels a step, {counted['copies']:.0f} copies and fills, "
                  f"{counted['device_ms']:.2f} ms of device time")
            summary[runner] = {"step_ms": 1000 * step, "batch": len(talker.scheduler.running), **counted}
        for key in (["self_cuda_time_total"] if talker.backend.device.type == "cuda" else []) + ["self_cpu_time_total"]:
            print(f"\n### top operators by {key} (5 steps)\n")
            print(prof.key_averages().table(sort_by=key, row_limit=18, max_name_column_width=48))
        print("\n| prompts prefilled at once | ms |\n| --- | --- |")
        for k in [k for k in (1, 4, 16) if k <= len(talker.scheduler.running)]:
            print(f"| {k} | {1000 * timed_prefill(talker, k):.2f} |")
    if args.json and summary:
        record_section(args.json, "frame_step", {"preset": args.preset, "dtype": args.dtype, "max_len": args.max_len,
                                                 "gpu_util": args.gpu_util, "text_bytes": args.text_bytes,
                                                 "graphs": not args.eager, "runners": summary}, args.platform)


if __name__ == "__main__":
    main()
