"""JUnit files from CI runs: which tests failed, and the matrix table with stall diagnoses."""
from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from ci.matrix import Cell, cell_in, task_of

DIAGNOSIS_RE = re.compile(r"\b(StageHandoffStall|StageStall|StageDied)\b[^\n]*|Timeout \(>[\d.]+s\) from pytest-timeout")


class JunitError(Exception):
    pass


@dataclass
class Case:
    classname: str
    name: str
    status: str          # passed | failed | error | skipped
    message: str
    suite: str

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


def parse(path: str | Path, data: bytes | None = None) -> list[Case]:
    try:
        root = ET.fromstring(data) if data is not None else ET.parse(path).getroot()
    except FileNotFoundError:
        raise JunitError(f"{path}: no such JUnit file") from None
    except ET.ParseError as e:
        raise JunitError(f"{path}: not valid JUnit XML ({e})") from None
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite") if root.tag == "testsuites" else None
    if suites is None:
        raise JunitError(f"{path}: not a JUnit report (root element <{root.tag}>, expected <testsuites> or <testsuite>)")
    cases = []
    for suite in suites:
        for tc in suite.iter("testcase"):
            if "name" not in tc.attrib:
                raise JunitError(f"{path}: a <testcase> has no name attribute")
            status, message = "passed", ""
            for tag in ("failure", "error", "skipped"):
                el = tc.find(tag)
                if el is not None:
                    status = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                    message = (el.get("message") or "") + "\n" + (el.text or "")
                    break
            cases.append(Case(tc.get("classname", ""), tc.get("name"), status, message.strip(), suite.get("name", "")))
    return cases


def failed_ids(cases: list[Case], root: Path) -> list[str]:
    ids = []
    for case in cases:
        if case.status in ("failed", "error"):
            nodeid = case.nodeid(root)
            if nodeid not in ids:
                ids.append(nodeid)
    return ids


def matrix(cases: list[Case]) -> list[dict]:
    rows: dict[tuple, dict] = defaultdict(lambda: {"passed": 0, "failed": 0, "stalled": 0, "skipped": 0,
                                                   "diagnoses": []})
    for case in cases:
        cell = cell_in(case.name)
        if cell is None:
            continue
        row = rows[(case.mode, cell, task_of(f"{case.classname}::{case.name}"))]
        found = DIAGNOSIS_RE.search(case.message) if case.status in ("failed", "error") else None
        if case.status == "passed":
            row["passed"] += 1
        elif case.status == "skipped":
            row["skipped"] += 1
        elif found:
            row["stalled"] += 1
            if found.group(0)[:160] not in row["diagnoses"]:
                row["diagnoses"].append(found.group(0)[:160])
        else:
            row["failed"] += 1
    out = []
    for (mode, cell, task), row in sorted(rows.items()):
        c = Cell.from_id(cell)
        out.append({"mode": mode, "cell": cell, "backend": c.backend, "runner": c.runner,
                    "cuda_graph": "cuda_graph" if c.cuda_graph == "on" else "no_cuda_graph", "handoff": c.handoff,
                    "task": task, **row})
    return out


def render(rows: list[dict], fmt: str) -> str:
    if fmt == "json":
        return json.dumps(rows, indent=2)
    if not rows:
        return "No matrix tests in these JUnit files.\n"
    lines = ["| mode | backend | runner | graph | handoff | task | passed | failed | stalled | diagnosis |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        verdict = "; ".join(r["diagnoses"]).replace("|", "/")
        lines.append(f"| {r['mode']} | {r['backend']} | {r['runner']} | {r['cuda_graph']} | {r['handoff']} | {r['task']} | "
                     f"{r['passed']} | {r['failed']} | {r['stalled']} | {verdict} |")
    return "\n".join(lines) + "\n"
