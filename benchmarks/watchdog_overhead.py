"""Throughput with and without the watchdog (offline, tiny preset).

    python benchmarks/watchdog_overhead.py --rounds 5 --batch 16

"off" disables the stall checks (dead stages are still noticed) and stretches heartbeats
to once an hour, so it measures the cost of heartbeat threads, progress tracking and the checks.  Each
mode keeps one engine and runs several timed batches; the medians are compared.
"""
from __future__ import annotations

import argparse
import statistics
import time

from engine.profile.resolve import resolve
from engine.runtime.engine import TTSEngine
from engine.request import SpeechRequest
from engine.process.tree import unwind_on_sigterm

MODES = {"on": [], "off": ["watchdog.enabled=false", "watchdog.heartbeat_interval_s=3600"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--runner", default="v2")
    args = ap.parse_args()
    unwind_on_sigterm()   # stopped early, what this started ends with it
    engines = {m: TTSEngine(resolve("qwen3_tts", platform="cpu", overrides=[f"model_runner={args.runner}", *o]))
               for m, o in MODES.items()}
    rates = {m: [] for m in MODES}
    try:
        for m, eng in engines.items():
            eng.generate([SpeechRequest("warm up", seed=0)])
        for r in range(args.rounds):
            for m in (list(MODES) if r % 2 == 0 else list(reversed(MODES))):   # alternate the order
                reqs = [SpeechRequest("x" * 60, seed=i) for i in range(args.batch)]
                t0 = time.perf_counter()
                res = engines[m].generate(reqs)
                rates[m].append(sum(len(x.codes) for x in res) / (time.perf_counter() - t0))
    finally:
        for eng in engines.values():
            eng.close()
    on, off = statistics.median(rates["on"]), statistics.median(rates["off"])
    print("| watchdog | median frames/s | rounds |")
    print("| --- | --- | --- |")
    print(f"| on | {on:.1f} | {', '.join(f'{x:.0f}' for x in rates['on'])} |")
    print(f"| off | {off:.1f} | {', '.join(f'{x:.0f}' for x in rates['off'])} |")
    print(f"overhead: {100 * (off - on) / off:+.2f}% of throughput")


if __name__ == "__main__":
    main()
