"""A lane's wall time run whole, with pytest-xdist workers, and as shards side by side.

    python benchmarks/lane_scaling.py tts-base
    python benchmarks/lane_scaling.py tts-base --workers 2 --shards 2

Each way runs the lane exactly as `lanekeeper run` does (its own artifacts directory under
a temporary one), and reports wall time, the tests it ran, and whether the merged result
(`lanekeeper report` over every JUnit file) counts the same tests as the whole run: a
spread-out lane that drops or repeats a test is not faster, it is wrong.  Prints a
Markdown table.  Stopped early (^C, SIGTERM), it stops the lanes it started and waits for them.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from ci.run import junit
from ci.lanes import schema as lanes
from ci.run import report
from ci.run.record import RUN_ID_ENV
from engine.process.tree import kill_tree, unwind_on_sigterm
from engine.profile.document import ProfileDoc

ROOT = Path(__file__).resolve().parents[1]


def lanekeeper(*args: str, run_id: str) -> subprocess.Popen:
    """One `lanekeeper run`; the runs of one way share a run id, as the shards of one CI build do."""
    return subprocess.Popen([sys.executable, "-m", "ci.cli", *args], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, RUN_ID_ENV: run_id})


def timed(runs: list[list[str]], out: Path) -> tuple[float, dict]:
    """Start every run at once, wait for all; wall time and the merged totals of their JUnit files."""
    t0 = time.monotonic()
    procs = []
    run_id = f"lane-scaling-{uuid.uuid4().hex[:12]}"
    try:
        for args in runs:   # one at a time: a stop between two starts still ends the first
            procs.append(lanekeeper(*args, run_id=run_id))
        for p in procs:
            p.wait()
    finally:   # stopped early: each lane passes SIGTERM to its pytest, which ends its engines and reports
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                kill_tree([p.pid])
    wall = time.monotonic() - t0
    cases = [c for f in sorted(out.rglob("junit.xml")) for c in junit.parse(f)]
    return wall, report.summarize(cases)["totals"] | {"tests": len(cases)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("lane", help="lane key or label")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--lanes-file", type=Path, default=None, help="default: the checkout's ci/lanes.yaml")
    ap.add_argument("--json", help="also merge the wall times into this timings file (benchmarks/results/cpu.json)")
    args = ap.parse_args()
    unwind_on_sigterm()   # the lanes stop too
    args.lanes_file = args.lanes_file or lanes.default_lanes_file()
    lane = lanes.find(args.lane, lanes.load(args.lanes_file))
    rows = []
    with tempfile.TemporaryDirectory(prefix="lane-scaling-") as tmp:
        tmp = Path(tmp)
        # workers are a property of the lane: each way reads a copy of the lanes file, serial (and each
        # shard) with none, the -n run with --workers
        for name, workers in (("serial", None), ("workers", args.workers)):
            doc = ProfileDoc.load(args.lanes_file)
            entry = next(l for l in doc.data["lanes"] if l["key"] == lane.key)
            if workers is None:
                entry.pop("workers", None)
            else:
                entry["workers"] = workers
            doc.save(tmp / f"{name}.yaml")

        def run(way: str, lanes_file: str, *extra: str) -> list[str]:
            return ["run", lane.key, "--artifacts", str(tmp / way), "--lanes-file", str(tmp / f"{lanes_file}.yaml"),
                    *extra]

        ways = [("whole, serial", [run("serial", "serial")], tmp / "serial"),
                (f"whole, -n {args.workers}", [run("workers", "workers")], tmp / "workers"),
                (f"{args.shards} shards side by side",
                 [run("shards", "serial", "--shard", f"{k}/{args.shards}") for k in range(1, args.shards + 1)],
                 tmp / "shards")]
        for name, runs, out in ways:
            wall, totals = timed(runs, out)
            rows.append((name, wall, totals))
    base = rows[0][1]
    print(f"| lane {lane.key} | wall s | vs serial | tests | passed | failed | skipped |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, wall, t in rows:
        print(f"| {name} | {wall:.0f} | {base / wall:.2f}x | {t['tests']} | {t['passed']} | {t['failed'] + t['stalled']} | "
              f"{t['skipped']} |")
    if len({t["tests"] for _, _, t in rows}) != 1:
        print("the three ways ran different numbers of tests")
        return 1
    if args.json:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        import results

        results.record_timings(args.json, [
            {"what": f"lane {lane.key} ({t['tests']} tests), {name}", "seconds": round(wall),
             "command": f"python benchmarks/lane_scaling.py {lane.key} --workers {args.workers} --shards {args.shards}"}
            for name, wall, t in rows])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
