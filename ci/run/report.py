"""Test results as one summary: which tests failed and why, and the matrix table with stall diagnoses.

The pytest plugin (matrix-summary.md, the terminal) and `lanekeeper report` (the Buildkite
annotation, the GitHub step summary, from JUnit files) both build `Case` records and render them
with `summarize` and `render` here, so every place shows the same counts in the same words.
A test stalled when it carries a stall `Diagnosis`; the words shown are the diagnosis's message.
"""
from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from ci.matrix import Cell, cell_in
from ci.run.record import RunRecord
from engine.diagnosis import Diagnosis


@dataclass
class Case:
    classname: str
    name: str
    status: str          # passed | failed | error | skipped
    message: str
    suite: str = ""
    diagnosis: Diagnosis | None = None
    task: str | None = None   # the task type a matrix test exercises, as it recorded it (marker `task`)

    def nodeid(self, root: Path) -> str:
        parts = self.classname.split(".")
        for cut in range(len(parts), 0, -1):
            path = "/".join(parts[:cut]) + ".py"
            if (root / path).is_file():
                return "::".join([path, *parts[cut:], self.name])
        return "::".join(["/".join(parts) + ".py", self.name])

    @property
    def mode(self) -> str:
        return "online" if ".online." in f".{self.classname}." else "offline"

    @classmethod
    def from_nodeid(cls, nodeid: str, status: str, message: str, suite: str = "",
                    diagnosis: Diagnosis | None = None, task: str | None = None) -> "Case":
        """A test's result as pytest's JUnit writer records it (classname: the module path, dotted)."""
        path, _, name = nodeid.partition("::")
        *classes, name = name.split("::")
        classname = ".".join([path.removesuffix(".py").replace("/", "."), *classes])
        return cls(classname, name, status, message, suite, diagnosis, task)

    @property
    def test(self) -> str:
        return f"{self.classname}::{self.name}"

    @property
    def stalled(self) -> bool:
        return self.status in ("failed", "error") and self.diagnosis is not None and self.diagnosis.stall


def _first_line(message: str) -> str:
    return next((l.strip() for l in message.splitlines() if l.strip()), "")[:200]


def summarize(cases: list[Case], root: Path | None = None) -> dict:
    """Totals, the matrix rows (cell x task, with skip reasons and diagnoses), the cells that stalled, and
    every failed test by its pytest node id (module paths resolved against `root`, the run's rootdir)."""
    root = root or Path.cwd()
    totals = {"passed": 0, "failed": 0, "stalled": 0, "skipped": 0}
    rows: dict[tuple, dict] = defaultdict(lambda: {"passed": 0, "failed": 0, "stalled": 0, "skipped": 0, "why": []})
    failures = []
    # In test-id order, not arrival order: workers (pytest -n), shards and the JUnit writer each see
    # the tests arrive differently, and the summary of one run must not depend on which is asked.
    for case in sorted(cases, key=lambda c: c.test):
        kind = {"passed": "passed", "skipped": "skipped"}.get(case.status, "stalled" if case.stalled else "failed")
        totals[kind] += 1
        why = case.diagnosis.message[:240] if kind == "stalled" else \
            f"skipped: {_first_line(case.message)}" if kind == "skipped" else \
            _first_line(case.message) if kind == "failed" else None
        if kind in ("failed", "stalled"):
            failure = {"test": case.nodeid(root), "status": kind, "why": why or case.status}
            if case.diagnosis is not None:
                failure["diagnosis"] = case.diagnosis.public()
            failures.append(failure)
        cell = cell_in(case.name)
        if cell is None:
            continue
        row = rows[(case.mode, cell, case.task or "-")]
        row[kind] += 1
        if why and why not in row["why"]:
            row["why"].append(why)
    stalled_cells = sorted({cell for (_, cell, _), row in rows.items() if row["stalled"]})
    out = []
    for (mode, cell, task), row in sorted(rows.items()):
        c = Cell.from_id(cell)
        out.append({"mode": mode, "cell": cell, "backend": c.backend, "runner": c.runner,
                    "cuda_graph": "cuda_graph" if c.cuda_graph == "on" else "no_cuda_graph", "handoff": c.handoff,
                    "task": task, **row})
    return {"totals": totals, "stalled_cells": stalled_cells, "rows": out, "failures": failures}


def red(summary: dict) -> bool:
    """A failure or a stall, or a run that only skipped (it ran nothing of what it claims)."""
    t = summary["totals"]
    return bool(t["failed"] or t["stalled"] or (t["skipped"] and not t["passed"]))


def annotation_style(summary: dict) -> str:
    """Buildkite's annotation style for it: error when red, success when green, info when nothing ran."""
    if red(summary):
        return "error"
    return "success" if summary["totals"]["passed"] else "info"


def run_notes(records: list[RunRecord | None], stall_reports: list[str]) -> list[str]:
    """The lines under the table about the runs themselves: a budget that cut a run short, where the
    stall reports are."""
    notes = [f"Lane budget of {r.budget or 0:.0f}s exhausted{f' ({r.lane})' if r.lane else ''}: "
             "the run stopped early." for r in records if r is not None and r.budget_hit]
    return notes + [f"Stall report: {path}" for path in stall_reports]


def render(summary: dict, fmt: str = "markdown", notes: list[str] = ()) -> str:
    """The one rendering of a run's results: the pytest plugin's summary and `lanekeeper report`."""
    if fmt == "json":
        return json.dumps({**summary, "notes": list(notes)}, indent=2)
    t = summary["totals"]
    lines = [f"**{'red' if red(summary) else 'green'}**: {t['passed']} passed, {t['failed']} failed, "
             f"{t['stalled']} stalled, {t['skipped']} skipped"]
    if summary["stalled_cells"]:
        lines.append(f"Stalled cells: {', '.join(summary['stalled_cells'])}")
    if summary["rows"]:
        lines += ["", "| mode | backend | runner | graph | handoff | task | passed | failed | stalled | skipped | why |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in summary["rows"]:
            why = "; ".join(r["why"]).replace("|", "/")
            lines.append(f"| {r['mode']} | {r['backend']} | {r['runner']} | {r['cuda_graph']} | {r['handoff']} | "
                         f"{r['task']} | {r['passed']} | {r['failed']} | {r['stalled']} | {r['skipped']} | {why} |")
    if summary["failures"]:
        lines += ["", "Failed tests:"]
        lines += [f"- `{f['test']}` ({f['status']}): {f['why']}" for f in summary["failures"]]
    lines += ["", *notes] if notes else []
    return "\n".join(lines) + "\n"
