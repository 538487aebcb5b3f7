"""The benchmark results files: one for the engine benchmarks on a GPU (`--json PATH`), and one for the
wall times on the CPU machine (`cpu_timing.py`, `lane_scaling.py --json`).

The offline and online scripts each write their own rows into the same file: a row is
keyed by mode, runner, graph mode and concurrency, a new run replaces the rows it
measured and keeps the rest, and the header says on which GPU, at which commit, when.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
from pathlib import Path

import torch

KEY = ("mode", "runner", "cuda_graph", "concurrency")
FIELDS = KEY + ("audio_s_per_s", "ttfp_p50_ms", "ttfp_p99_ms", "rtf_mean")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def device_name(platform_name: str | None) -> str:
    if platform_name == "cuda" or (platform_name is None and torch.cuda.is_available()):
        return torch.cuda.get_device_name(0)
    return f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"


def commit() -> str:
    """The measured commit: LANEKEEPER_COMMIT where the tree travelled without its history, else git's."""
    if os.environ.get("LANEKEEPER_COMMIT"):
        return os.environ["LANEKEEPER_COMMIT"]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("-dirty" if dirty else "")


def record(path: str, rows: list[dict], platform_name: str | None) -> None:
    """Merge these rows into the file at path (made if missing)."""
    for row in rows:
        missing = [f for f in FIELDS if f not in row]
        if missing:
            raise ValueError(f"benchmark row lacks {', '.join(missing)}: {row}")
    file = Path(path)
    doc = json.loads(file.read_text()) if file.exists() else {"rows": []}
    gpu = device_name(platform_name)
    if doc.get("gpu") not in (None, gpu):   # another device's figures are not ours to mix in
        doc = {"rows": []}
    new = {tuple(r[k] for k in KEY): {f: r[f] for f in FIELDS} for r in rows}
    kept = [r for r in doc["rows"] if tuple(r[k] for k in KEY) not in new]
    merged = sorted(kept + list(new.values()), key=lambda r: (r["mode"], r["runner"], r["cuda_graph"], r["concurrency"]))
    doc = {"gpu": gpu, "commit": commit(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "rows": merged}
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(json.dumps(doc, indent=2) + "\n")


def table(doc: dict) -> str:
    """The rows as the README shows them."""
    lines = [f"{doc['gpu']}, commit {doc['commit'][:12]}, {doc['date']}", "",
             "| mode | runner | graphs | concurrency | audio-s/s | TTFP p50 ms | TTFP p99 ms | mean RTF |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in doc["rows"]:
        lines.append(f"| {r['mode']} | {r['runner']} | {r['cuda_graph']} | {r['concurrency']} | "
                     f"{r['audio_s_per_s']:.1f} | {r['ttfp_p50_ms']:.0f} | {r['ttfp_p99_ms']:.0f} | {r['rtf_mean']:.2f} |")
    return "\n".join(lines)


TIMING_FIELDS = ("what", "command", "seconds")


def load(path: str) -> dict:
    return json.loads(Path(path).read_text())


def record_timings(path: str, rows: list[dict]) -> None:
    """Merge wall-time rows (keyed by `what`) into the CPU timings file; the header names this machine,
    the commit and the time, and a file of another machine starts over."""
    for row in rows:
        missing = [f for f in TIMING_FIELDS if f not in row]
        if missing:
            raise ValueError(f"timing row lacks {', '.join(missing)}: {row}")
    file = Path(path)
    doc = load(path) if file.exists() else {"rows": []}
    machine = device_name("cpu")
    if doc.get("machine") not in (None, machine):
        doc = {"rows": []}
    measured_at = commit()
    new = {r["what"]: {**r, "commit": measured_at} for r in rows}   # each row says where it was measured
    merged = [r for r in doc["rows"] if r["what"] not in new] + list(new.values())
    doc = {"machine": machine, "commit": measured_at,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "rows": merged}
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(json.dumps(doc, indent=2) + "\n")


def timing_table(doc: dict) -> str:
    """The CPU wall times as the README shows them."""
    lines = [f"{doc['machine']}, latest {doc['date']}", "",
             "| what | seconds | commit | command |", "| --- | --- | --- | --- |"]
    for r in doc["rows"]:
        lines.append(f"| {r['what']} | {r['seconds']:g} | {r.get('commit', '?')[:12]} | `{r['command']}` |")
    return "\n".join(lines)


README_MARKS = ("<!-- timings -->\n", "<!-- /timings -->")


def readme_timings(readme: str) -> str:
    """What stands between the README's timing marks."""
    start = readme.index(README_MARKS[0]) + len(README_MARKS[0])
    return readme[start:readme.index(README_MARKS[1])]


def with_timings(readme: str, doc: dict) -> str:
    old = readme_timings(readme)
    start = readme.index(README_MARKS[0]) + len(README_MARKS[0])
    return readme[:start] + timing_table(doc) + "\n" + readme[start + len(old):]


if __name__ == "__main__":
    import sys

    args = [a for a in sys.argv[1:] if a != "--readme"]
    doc = load(args[0] if args else "benchmarks/results/h200.json")
    if "--readme" in sys.argv:   # the timings table into README.md, between its marks
        readme = Path(__file__).resolve().parents[1] / "README.md"
        readme.write_text(with_timings(readme.read_text(), doc))
    print(table(doc) if "gpu" in doc else timing_table(doc))
