"""The benchmark results files: one for the engine benchmarks on a GPU (`--json PATH`), and one for the
wall times on the CPU machine (`cpu_timing.py`, `lane_scaling.py --json`).

The offline and online scripts each write their own rows into the same file: a row is
keyed by mode, runner, graph mode and concurrency, a new run replaces the rows it
measured and keeps the rest, and the header says on which GPU, at which commit, when.
Every row carries its commit, its request count and its codec's cost, and the file
holds one commit's rows: a run at another commit starts it over, so figures measured
on different code are never shown side by side.
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
FIELDS = KEY + ("audio_s_per_s", "ttfp_p50_ms", "ttfp_p99_ms", "rtf_mean", "requests", "mean_in_flight",
                "codec_gmac_per_audio_s", "commit")


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


def _doc_for(path: str, platform_name: str | None, measured_at: str) -> dict:
    """The results file as it stands, or an empty one where it holds another device's or another
    commit's figures: those are not ours to mix in."""
    file = Path(path)
    doc = json.loads(file.read_text()) if file.exists() else {"rows": []}
    if doc.get("gpu") not in (None, device_name(platform_name)) or doc.get("commit") not in (None, measured_at):
        doc = {"rows": []}
    return doc


def _write(path: str, doc: dict, platform_name: str | None, measured_at: str) -> None:
    doc.update(gpu=device_name(platform_name), commit=measured_at,
               date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(doc, indent=2) + "\n")


def record(path: str, rows: list[dict], platform_name: str | None) -> None:
    """Merge these rows, stamped with this commit, into the file at path (made if missing)."""
    measured_at = commit()
    rows = [{**row, "commit": measured_at} for row in rows]
    for row in rows:
        missing = [f for f in FIELDS if f not in row]
        if missing:
            raise ValueError(f"benchmark row lacks {', '.join(missing)}: {row}")
    doc = _doc_for(path, platform_name, measured_at)
    new = {tuple(r[k] for k in KEY): {f: r[f] for f in FIELDS} for r in rows}
    kept = [r for r in doc["rows"] if tuple(r[k] for k in KEY) not in new]
    doc["rows"] = sorted(kept + list(new.values()), key=lambda r: tuple(r[k] for k in KEY))
    _write(path, doc, platform_name, measured_at)


def record_section(path: str, name: str, value: dict, platform_name: str | None) -> None:
    """Set one named section beside the rows (the frame step, the codec's parity), at this commit."""
    measured_at = commit()
    doc = _doc_for(path, platform_name, measured_at)
    doc[name] = {**value, "commit": measured_at}
    _write(path, doc, platform_name, measured_at)


def table(doc: dict) -> str:
    """The rows as the README shows them."""
    lines = [f"{doc['gpu']}, commit {doc['commit'][:12]}, {doc['date']}", "",
             "| mode | runner | graphs | concurrency | requests | mean in flight | audio-s/s | TTFP p50 ms | "
             "TTFP p99 ms | mean RTF | codec GMAC/audio-s |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    shown = [("requests", "d"), ("mean_in_flight", ".1f"), ("audio_s_per_s", ".1f"), ("ttfp_p50_ms", ".0f"),
             ("ttfp_p99_ms", ".0f"), ("rtf_mean", ".2f"), ("codec_gmac_per_audio_s", ".1f")]
    for r in doc["rows"]:   # a file written before a field existed shows "-" for it
        cells = [r["mode"], r["runner"], r["cuda_graph"], str(r["concurrency"])]
        cells += [format(r[f], spec) if f in r else "-" for f, spec in shown]
        lines.append("| " + " | ".join(cells) + " |")
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
