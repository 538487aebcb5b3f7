"""A stalled test, named: on a watchdog diagnosis (StageHandoffStall, StageStall, StageDied) or a
pytest-timeout, the Python stacks of every engine process are dumped (faulthandler on SIGUSR1 in
each; py-spy too when installed), the engines are killed, and the incident goes to the stall
report.  Later tests of a stalled cell fail at once.

The diagnosis travels with the test's report: as a JUnit property (`lanekeeper_diagnosis`, the
Diagnosis as JSON) and as the incident (`report.lanekeeper_incident`), which reaches the books
wherever they are kept, an xdist controller included.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

from ci.pytest_plugin.parametrize import cell_of, task_of
from ci.pytest_plugin.run import RUN, RunState
from ci.pytest_plugin.timeouts import STARTED, timed_out
from engine.diagnosis import TIMEOUT, WATCHDOG_KINDS, Diagnosis
from engine.process.stacks import STACK_DUMP_SIGNAL, stack_file
from engine.process.tree import describe_process, engine_processes, kill_tree
from engine.runtime.registry import REGISTRY

from ci.run.junit import PROPERTY


class Incident(BaseModel):
    """One stalled test, as the stall report keeps it."""
    test: str
    cell: str | None
    task: str | None
    phase: str
    seconds: float                   # the test phase's duration
    diagnosis: Diagnosis             # the first diagnosis: what the test is reported as
    diagnoses: list[Diagnosis]       # every one the failure carried
    stacks: dict[str, str]           # process -> its Python stacks


def diagnosis_of(report) -> Diagnosis | None:
    """The diagnosis a test's report carries (its JUnit property), if any."""
    for name, value in getattr(report, "user_properties", ()):
        if name == PROPERTY:
            return Diagnosis.model_validate_json(value)
    return None


def diagnoses_in(exc) -> list[Diagnosis]:
    """Watchdog diagnoses carried by an exception or its causes: an engine's RequestFailed, or an API
    error whose body holds `error.diagnosis` (the openai client's, say)."""
    found, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        diagnosis = getattr(exc, "diagnosis", None)
        body = getattr(exc, "body", None)
        if diagnosis is None and isinstance(body, dict):
            body = body.get("error", body)
            diagnosis = body.get("diagnosis") if isinstance(body, dict) else None
            try:
                diagnosis = Diagnosis.model_validate(diagnosis) if isinstance(diagnosis, dict) else None
            except ValidationError:   # not one of ours (another server's body): no diagnosis, not a crash
                diagnosis = None
        if isinstance(diagnosis, Diagnosis) and diagnosis.kind in WATCHDOG_KINDS:
            found.append(diagnosis)
        exc = exc.__cause__ or exc.__context__
    return found


def dump_stacks(state: RunState) -> dict[str, str]:
    """SIGUSR1 every engine process (faulthandler writes its stacks), then collect; py-spy when present."""
    procs = engine_processes()
    for proc in procs:
        try:
            os.kill(proc.pid, STACK_DUMP_SIGNAL)
        except ProcessLookupError:
            pass
    time.sleep(0.5)
    stacks = {}
    py_spy = shutil.which("py-spy")
    for proc in procs:
        path = Path(stack_file(str(state.stack_dir), proc.pid))
        text = path.read_text() if path.exists() else ""
        if py_spy:
            try:
                text += "\n# py-spy dump\n" + subprocess.run([py_spy, "dump", "--pid", str(proc.pid)], text=True,
                                                            capture_output=True, timeout=10).stdout
            except (subprocess.SubprocessError, OSError):
                pass
        try:
            role = describe_process(proc.name(), " ".join(proc.cmdline())) or "exited"
        except Exception:   # gone since
            role = "exited"
        stacks[f"{role}, pid {proc.pid}"] = text or "(no stack dump received)"
    return stacks


def kill_engines() -> None:
    REGISTRY.kill_all()
    kill_tree(engine_processes())


def pytest_runtest_setup(item):
    state = item.config.stash[RUN]
    cell = cell_of(item)
    if cell and cell in state.stalled_cells:
        pytest.fail(f"cell {cell} already stalled in this run: {state.stalled_cells[cell]}", pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if not (report.failed and call.excinfo is not None) or \
            not (report.when == "call" or report.when == "setup"):
        return report
    exc = call.excinfo.value
    started = item.stash.get(STARTED, time.time())
    found = diagnoses_in(exc) or REGISTRY.diagnoses_since(started)
    timeout = timed_out(item, exc)
    if timeout is not None:
        diagnosis = Diagnosis(kind=TIMEOUT, message=f"Timeout: {item.nodeid} ran past its hard timeout of {timeout:g}s")
    elif found:
        diagnosis = found[0]
    else:
        return report
    state = item.config.stash[RUN]
    cell = cell_of(item)
    incident = Incident(test=item.nodeid, cell=cell, task=task_of(item), phase=report.when,
                        seconds=round(call.duration, 2), diagnosis=diagnosis, diagnoses=found,
                        stacks=dump_stacks(state))
    kill_engines()
    if cell:
        state.stalled_cells[cell] = diagnosis.message
    # The JUnit record keeps the diagnosis (pytest writes a test's user_properties with its teardown);
    # the report carries the incident to the books as plain JSON values, which cross to an xdist controller.
    prop = (PROPERTY, diagnosis.model_dump_json(exclude={"traceback"}))
    item.user_properties.append(prop)
    report.user_properties.append(prop)   # a copy of the item's, taken before this
    report.lanekeeper_incident = incident.model_dump(mode="json")
    report.longrepr = f"{diagnosis.message}\n\n{report.longreprtext}"   # the diagnosis, in words, leads
    return report


def write_stall_report(state: RunState) -> None:
    if state.report_dir is None:
        return
    state.report_dir.mkdir(parents=True, exist_ok=True)
    (state.report_dir / "stall-report.json").write_text(
        json.dumps([inc.model_dump(mode="json") for inc in state.incidents], indent=2))
    lines = ["# Stall report", ""]
    for inc in state.incidents:
        d = inc.diagnosis
        lines += [f"## {d.kind} in `{inc.test}`", "",
                  f"- cell: `{inc.cell or '-'}`, task: {inc.task or '-'}",
                  f"- after {inc.seconds} s: {d.message}"]
        if d.stage is not None:
            lines.append(f"- stage {d.stage} ({d.stage_name}), request(s) "
                         f"{', '.join(d.request_ids) or d.request_id or '-'}; frames produced "
                         f"{d.frames_produced}, handed off {d.frames_handed_off}, consumed {d.frames_consumed}")
        for proc, stack in inc.stacks.items():
            lines += ["", f"<details><summary>stacks of {proc}</summary>", "", "```", stack.strip(), "```",
                      "</details>"]
        lines.append("")
    (state.report_dir / "stall-report.md").write_text("\n".join(lines))


# The incident crosses from an xdist worker to the controller with its report, through pytest's report
# serialisation hooks, so the books see it wherever the test ran.
@pytest.hookimpl(wrapper=True)
def pytest_report_to_serializable(config, report):
    data = yield
    incident = getattr(report, "lanekeeper_incident", None)
    if data is not None and incident is not None:
        data["lanekeeper_incident"] = incident
    return data


@pytest.hookimpl(wrapper=True)
def pytest_report_from_serializable(config, data):
    report = yield
    if report is not None and "lanekeeper_incident" in data:
        report.lanekeeper_incident = data["lanekeeper_incident"]
    return report
