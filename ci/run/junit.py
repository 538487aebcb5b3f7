"""JUnit XML files, read into `ci.run.report.Case` records: what `lanekeeper report`, `repro` and rollback
take from a CI run.  A stalled test's record carries its Diagnosis as the property
`lanekeeper_diagnosis` (JSON), written by the pytest plugin and read back through the model; a matrix
test's, its task type as `lanekeeper_task`."""
from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from pydantic import ValidationError

from ci.run.report import Case
from engine.diagnosis import Diagnosis
from engine.errors import UserError

PROPERTY = "lanekeeper_diagnosis"
TASK_PROPERTY = "lanekeeper_task"


class JunitError(UserError):
    pass


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
            task = next((p.get("value") for p in tc.iter("property") if p.get("name") == TASK_PROPERTY), None)
            cases.append(Case(tc.get("classname", ""), tc.get("name"), status, message.strip(), suite.get("name", ""),
                              _diagnosis(path, tc), task))
    return cases


def failed_ids(cases: list[Case], root: Path) -> list[str]:
    ids = []
    for case in cases:
        if case.status in ("failed", "error"):
            nodeid = case.nodeid(root)
            if nodeid not in ids:
                ids.append(nodeid)
    return ids


def _diagnosis(path, tc) -> Diagnosis | None:
    for prop in tc.iter("property"):
        if prop.get("name") == PROPERTY:
            try:
                return Diagnosis.model_validate_json(prop.get("value") or "")
            except ValidationError as e:
                raise JunitError(f"{path}: test {tc.get('name')}: property {PROPERTY} is not a diagnosis "
                                 f"({e.errors()[0]['msg']})") from None
    return None
