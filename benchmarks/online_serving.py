"""Online serving benchmark: streaming PCM at several concurrencies, per model runner.

    python benchmarks/online_serving.py --runner v1 --runner v2 --concurrency 1 8 64

Starts `lanekeeper serve` for each runner and reports, as vllm-omni's `bench serve`
does: TTFP (time to the first non-empty audio chunk) p50/p99, audio seconds produced
per wall second, and mean RTF (latency / audio duration).  Prints a Markdown table, then
where each stage's time went at each level, from the server's /metrics.
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from engine.serve.launcher import RemoteServer
from results import percentile, record   # this script's folder is on sys.path when run

SENTENCES = ["The talker emits one codec frame per step.", "Short reply.",
             "Stage one decodes frames into audio with left context, chunk by chunk, as they arrive.",
             "A medium length sentence for the benchmark."]


async def one(client, url, i):
    t0 = time.perf_counter()
    first, size = None, 0
    async with client.stream("POST", url, json={"input": SENTENCES[i % len(SENTENCES)], "response_format": "pcm",
                                                "stream": True, "seed": i}) as r:
        r.raise_for_status()
        async for chunk in r.aiter_bytes():
            if chunk and first is None:
                first = time.perf_counter() - t0
            size += len(chunk)
    latency = time.perf_counter() - t0
    audio_s = size / 2 / 24000
    return first, latency, audio_s


async def run_level(url, concurrency, requests):
    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        async def guarded(i):
            async with sem:
                return await one(client, url, i)
        t0 = time.perf_counter()
        rows = await asyncio.gather(*(guarded(i) for i in range(requests)))
        wall = time.perf_counter() - t0
    ttfp = [1000 * r[0] for r in rows]
    return {"requests": requests, "audio_s_per_s": sum(r[2] for r in rows) / wall,
            "ttfp_p50_ms": percentile(ttfp, 0.5), "ttfp_p99_ms": percentile(ttfp, 0.99),
            "rtf_mean": statistics.mean(r[1] / r[2] for r in rows)}


PARTS = [("0", "decode"), ("0", "admit"), ("0", "readback"), ("0", "handoff"), ("1", "decode")]


def stage_counters(base_url: str) -> dict:
    """The server's per-stage loop seconds and stage 1's windows and passes, as /metrics has them now."""
    out = {}
    for family in text_string_to_metric_families(httpx.get(base_url + "/metrics", timeout=30).text):
        for s in family.samples:
            if s.name == "lanekeeper_stage_seconds":
                out[(s.labels["stage"], s.labels["part"])] = s.value
            elif s.name in ("lanekeeper_code2wav_windows", "lanekeeper_code2wav_passes"):
                out[s.name] = s.value
    return out


def breakdown(before: dict, after: dict, wall: float) -> str:
    """One table row: each part's share of the level's wall time, and stage 1's windows per pass."""
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    shares = [100 * delta.get(p, 0) / wall for p in PARTS]
    passes = delta.get("lanekeeper_code2wav_passes", 0)
    per_pass = delta.get("lanekeeper_code2wav_windows", 0) / passes if passes else 0
    return " | ".join(f"{s:.0f} %" for s in shares) + f" | {per_pass:.1f} |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runner", action="append")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--platform", default="cpu")
    ap.add_argument("--cuda-graph", choices=["on", "off"], default="on")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--json", help="also merge the rows into this results file (benchmarks/results.py)")
    args = ap.parse_args()
    rows, where = [], []
    print("| runner | concurrency | requests | audio-s/s | TTFP p50 ms | TTFP p99 ms | mean RTF |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for runner in args.runner or ["v1", "v2"]:
        extra = []
        eager = "true" if args.cuda_graph == "off" else "false"
        for o in [f"model_runner={runner}", f"stages.0.enforce_eager={eager}"] + args.overrides:
            extra += ["--set", o]
        with RemoteServer(["--platform", args.platform, *extra]) as srv:
            url = srv.url + "/v1/audio/speech"
            asyncio.run(run_level(url, 2, 4))   # warm-up
            for c in args.concurrency:
                before, t0 = stage_counters(srv.url), time.perf_counter()
                row = asyncio.run(run_level(url, c, max(8, 2 * c)))
                time.sleep(1.5)   # one more heartbeat, so the counters cover the level's end
                where.append(f"| {runner} | {c} | " + breakdown(before, stage_counters(srv.url), time.perf_counter() - t0))
                rows.append({**row, "mode": "online", "runner": runner, "cuda_graph": args.cuda_graph, "concurrency": c})
                print(f"| {runner} | {c} | {row['requests']} | {row['audio_s_per_s']:.1f} | {row['ttfp_p50_ms']:.0f} | "
                      f"{row['ttfp_p99_ms']:.0f} | {row['rtf_mean']:.2f} |", flush=True)
    print("\nWhere the stages' time went (share of each level's wall time):\n")
    print("| runner | concurrency | stage 0 decode | admit | readback | handoff | stage 1 decode | windows per pass |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    print("\n".join(where))
    if args.json:
        record(args.json, rows, args.platform)


if __name__ == "__main__":
    main()
