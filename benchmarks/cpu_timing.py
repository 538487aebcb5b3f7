"""Wall times on this CPU machine, into benchmarks/results/cpu.json: the test command `.ci/run` runs,
step by step, and how long an engine takes to start.

    python benchmarks/cpu_timing.py                 # everything (the suite alone takes minutes)
    python benchmarks/cpu_timing.py --only quick    # the engine start and the lane dependencies

The README's timing table is rendered from that file (`python benchmarks/results.py
benchmarks/results/cpu.json`), and a test holds the two equal, so every figure there comes from a
run of a script, at a commit it names.
"""
from __future__ import annotations

import argparse
import os
import shlex
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import results  # noqa: E402
from engine.process.tree import kill_tree, unwind_on_sigterm  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "cpu.json"


def test_steps() -> list[str]:
    """The test command of the README (what `.ci/run` runs), without its installs."""
    text = (ROOT / ".ci" / "run").read_text()
    command = next(line for line in text.splitlines() if "pytest" in line and not line.startswith("#"))
    return [step.strip() for step in command.split("&&") if "pip" not in step]


def timed(command: str) -> float:
    """Seconds the command took.  It runs in a session of its own; stopped early, this passes SIGTERM
    to all of it (pytest's workers end the engines they started) and kills what is left a minute later."""
    t0 = time.monotonic()
    proc = subprocess.Popen(command, shell=True, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        status = proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
        kill_tree([proc.pid], group=proc.pid)
    if status != 0:
        raise SystemExit(f"{command}: exit status {status}; timings of a red run mean nothing")
    return time.monotonic() - t0


def engine_start(repeats: int = 5) -> float:
    """Median seconds from TTSEngine() to ready, on the CPU, after the first (which pays the fork server)."""
    from engine.profile.resolve import resolve
    from engine.runtime.engine import TTSEngine

    profile = resolve("qwen3_tts", platform="cpu")
    seconds = []
    for _ in range(repeats + 1):
        t0 = time.monotonic()
        with TTSEngine(profile):
            seconds.append(time.monotonic() - t0)
    return statistics.median(seconds[1:])


def lane_dependencies() -> float:
    """Seconds to compute every lane's files (what `pipeline --changed-since` does once a build)."""
    from ci.lanes import deps, schema

    t0 = time.monotonic()
    deps.lane_files(schema.load(ROOT / "ci" / "lanes.yaml"), ROOT)
    return time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=("tests", "quick"), help="measure only this (quick: the engine start and "
                                                              "the lane dependencies)")
    ap.add_argument("--json", type=Path, default=OUT, help="default: %(default)s")
    args = ap.parse_args()
    unwind_on_sigterm()   # stopped early, the suite it runs ends with it
    rows = []
    if args.only != "quick":
        for step in test_steps():
            rows.append({"what": f"`.ci/run` step: {shlex.split(step)[-1] if 'lanekeeper' in step else 'the suite'}",
                         "command": step, "seconds": round(timed(step), 1)})
            print(rows[-1], flush=True)
    if args.only != "tests":
        rows.append({"what": "engine start (median of 5)", "command": "TTSEngine(resolve('qwen3_tts', platform='cpu'))",
                     "seconds": round(engine_start(), 2)})
        rows.append({"what": "every lane's dependency files, computed", "command": "ci.lanes.deps.lane_files",
                     "seconds": round(lane_dependencies(), 2)})
        print(rows[-2:], flush=True)
    results.record_timings(str(args.json), rows)
    print(results.timing_table(results.load(str(args.json))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
