"""Online serving benchmark: streaming PCM at several concurrencies, per model runner.

    python benchmarks/online_serving.py --runner v1 --runner v2 --concurrency 1 8 64

Each level is steady state (benchmarks/workload.py): C clients send the committed texts back to
back for at least 10 x C requests and 30 s.  Starts `lanekeeper serve` for each runner and reports, as vllm-omni's `bench serve`
does: TTFP (time to the first non-empty audio chunk) p50/p99, audio seconds produced
per wall second, and mean RTF (latency / audio duration).  Prints a Markdown table, then
where each stage's time went at each level, from the server's /metrics.
"""
from __future__ import annotations

import argparse
import asyncio
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from engine.profile.resolve import resolve
from engine.serve.launcher import RemoteServer
from engine.process.tree import unwind_on_sigterm
from codec_cost import codec_cost   # this script's folder is on sys.path when run
from results import record
from workload import TEXTS, level_done, summarize

async def one(client, url, text, i):
    t0 = time.perf_counter()
    first, size = None, 0
    async with client.stream("POST", url, json={"input": text, "response_format": "pcm",
                                                "stream": True, "seed": i}) as r:
        r.raise_for_status()
        async for chunk in r.aiter_bytes():
            if chunk and first is None:
                first = time.perf_counter() - t0
            size += len(chunk)
    return first, time.perf_counter() - t0, size / 2 / 24000


async def run_level(url, concurrency, steady=True):
    """C clients, each sending its next request as soon as the last one ends, until the level is
    steady (workload.level_done); `steady=False` sends C requests once (a warm-up)."""
    limits = httpx.Limits(max_connections=concurrency + 4)
    done, issued = [], 0
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        t0 = time.perf_counter()

        def more() -> bool:
            return not level_done(issued, time.perf_counter() - t0, concurrency) if steady else issued < concurrency

        async def client_loop():
            nonlocal issued
            while more():
                i, issued = issued, issued + 1
                done.append(await one(client, url, TEXTS[i % len(TEXTS)], i))
        await asyncio.gather(*(client_loop() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    return summarize(done, wall)


PARTS = [("0", "decode"), ("0", "admit"), ("0", "readback"), ("0", "handoff"), ("0", "inbox"), ("1", "decode"),
         ("1", "readback")]


def stage_counters(base_url: str) -> dict:
    """The server's per-stage loop seconds and stage 1's windows and passes, as /metrics has them now."""
    out = {}
    for family in text_string_to_metric_families(httpx.get(base_url + "/metrics", timeout=30).text):
        for s in family.samples:
            if s.name == "lanekeeper_stage_seconds":
                out[(s.labels["stage"], s.labels["part"])] = s.value
            elif s.name in ("lanekeeper_code2wav_windows", "lanekeeper_code2wav_passes",
                            "lanekeeper_code2wav_replay_seconds"):
                out[s.name] = s.value
            elif s.name == "lanekeeper_code2wav_frames":
                out[(s.name, s.labels["of"])] = s.value
    return out


def breakdown(before: dict, after: dict, wall: float) -> str:
    """One table row: each part's share of the level's wall time; stage 1's windows per pass, the frames
    its passes ran beyond the windows' own, and its captured passes' device time, each as timed alone, as
    a share of the wall time (beside stage 1's decode and readback, what sharing the device cost it)."""
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    shares = [100 * delta.get(p, 0) / wall for p in PARTS]
    passes = delta.get("lanekeeper_code2wav_passes", 0)
    per_pass = delta.get("lanekeeper_code2wav_windows", 0) / passes if passes else 0
    held = delta.get(("lanekeeper_code2wav_frames", "windows"), 0)
    padding = 100 * (delta.get(("lanekeeper_code2wav_frames", "passes"), 0) / held - 1) if held else 0
    alone = 100 * delta.get("lanekeeper_code2wav_replay_seconds", 0) / wall
    return " | ".join(f"{s:.0f} %" for s in shares) + f" | {per_pass:.1f} | {padding:.0f} % | {alone:.0f} % |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runner", action="append")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--platform", default="cpu")
    ap.add_argument("--cuda-graph", choices=["on", "off"], default="on")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--json", help="also merge the rows into this results file (benchmarks/results.py)")
    args = ap.parse_args()
    unwind_on_sigterm()   # stopped early, what this started ends with it
    preset = resolve("qwen3_tts", platform=args.platform, overrides=args.overrides).config.model.preset
    cost = codec_cost(preset)
    print(f"{preset}: codec {cost['codec_gmac_per_audio_s']:.1f} GMAC per audio second, "
          f"{cost['codec_params_m']:.1f}M parameters; {len(TEXTS)} texts\n")
    rows, where = [], []
    print("| runner | concurrency | requests | mean in flight | audio-s/s | TTFP p50 ms | TTFP p99 ms | mean RTF |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    try:
        for runner in args.runner or ["v1", "v2"]:
            extra = []
            eager = "true" if args.cuda_graph == "off" else "false"
            for o in [f"model_runner={runner}", f"stages.0.enforce_eager={eager}"] + args.overrides:
                extra += ["--set", o]
            with RemoteServer(["--platform", args.platform, *extra]) as srv:
                url = srv.url + "/v1/audio/speech"
                asyncio.run(run_level(url, 4, steady=False))   # warm-up
                for c in args.concurrency:
                    before, t0 = stage_counters(srv.url), time.perf_counter()
                    try:
                        row = asyncio.run(run_level(url, c))
                    except httpx.HTTPError:   # the server's side of it, before the client's traceback
                        print(f"runner {runner}, concurrency {c}: a request failed; the server's log ends:\n"
                              f"{srv.log_tail(60)}", flush=True)
                        raise
                    time.sleep(1.5)   # one more heartbeat, so the counters cover the level's end
                    shares = breakdown(before, stage_counters(srv.url), time.perf_counter() - t0)
                    where.append(f"| {runner} | {c} | {shares}")
                    rows.append({**row, **cost, "mode": "online", "runner": runner, "cuda_graph": args.cuda_graph,
                                 "concurrency": c})
                    print(f"| {runner} | {c} | {row['requests']} | {row['mean_in_flight']:.1f} | "
                          f"{row['audio_s_per_s']:.1f} | {row['ttfp_p50_ms']:.0f} | {row['ttfp_p99_ms']:.0f} | "
                          f"{row['rtf_mean']:.2f} |", flush=True)
                    if args.json:   # level by level: a run cut short keeps the levels it finished
                        record(args.json, rows[-1:], args.platform)
    finally:   # stopped early too: the levels it finished
        print("\nWhere the stages' time went (share of each level's wall time):\n")
        print("| runner | concurrency | stage 0 decode | admit | readback | handoff | inbox | stage 1 decode "
              "| stage 1 readback | windows per pass | padding | stage 1 passes alone |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        print("\n".join(where))


if __name__ == "__main__":
    main()
