"""The run's results, kept from the reports where the run is reported (the only process, or the xdist
controller), as pytest's JUnit writer keeps them; the matrix summary, printed and written as
Markdown for CI annotations; a run whose every test was skipped is red (it ran nothing it claims to)."""
from __future__ import annotations

import pytest

from ci.pytest_plugin.run import RUN, RunState, is_worker
from ci.pytest_plugin.parametrize import task_of
from ci.pytest_plugin.stalls import Incident, diagnosis_of, write_stall_report
from ci.pytest_plugin.timeouts import budget, budget_exhausted
from ci.run import record
from ci.run.report import Case, render, run_notes, summarize


class Books:
    """Registered in the controller only (a worker's reports reach the controller's)."""

    def __init__(self, state: RunState):
        self.state = state

    def pytest_runtest_logreport(self, report):
        state = self.state
        if report.when == "call" or (report.when == "setup" and (report.failed or report.skipped)) \
                or (report.when == "teardown" and report.failed):   # JUnit marks the test an error then
            state.cases[report.nodeid] = case_of(report)
        incident = getattr(report, "lanekeeper_incident", None)
        if incident is not None:
            incident = Incident.model_validate(incident)
            state.incidents.append(incident)
            if incident.cell:
                state.stalled_cells[incident.cell] = incident.diagnosis.message
            write_stall_report(state)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error):
        if getattr(node, "workeroutput", {}).get("lanekeeper_budget_hit"):
            self.state.budget_hit = True


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    if not is_worker(config):
        config.pluginmanager.register(Books(config.stash[RUN]), "lanekeeper-books")


def case_of(report) -> Case:
    """A report as pytest's JUnit writer records it (same status, same message), so that the summary
    made here and the one `lanekeeper report` makes from the JUnit file agree."""
    diagnosis, task = diagnosis_of(report), task_of(report)
    if report.passed:
        return Case.from_nodeid(report.nodeid, "passed", "", task=task)
    if report.skipped and hasattr(report, "wasxfail"):   # an expected failure: JUnit's "pytest.xfail" skip
        return Case.from_nodeid(report.nodeid, "skipped", report.wasxfail.removeprefix("reason: "), task=task)
    if report.skipped:   # longrepr is (file, line, "Skipped: <reason>")
        return Case.from_nodeid(report.nodeid, "skipped", str(report.longrepr[2]).removeprefix("Skipped: "), task=task)
    crash = getattr(report.longrepr, "reprcrash", None)
    reason = crash.message if crash is not None else str(report.longrepr)
    if report.when == "call":
        return Case.from_nodeid(report.nodeid, "failed", f"{reason}\n{report.longrepr}", diagnosis=diagnosis, task=task)
    return Case.from_nodeid(report.nodeid, "error", f'failed on {report.when} with "{reason}"\n{report.longrepr}',
                            diagnosis=diagnosis, task=task)


def run_record(state: RunState) -> record.RunRecord:
    config = state.config
    shard = config.getoption("lk_shard")
    suite = config.getini("junit_suite_name")
    return record.RunRecord(run_id=state.run_id, lane=None if suite == "pytest" else suite,
                            shard=f"{shard[0]}/{shard[1]}" if shard else None, budget_hit=state.budget_hit,
                            budget=budget(config))


def summary_markdown(state: RunState) -> str:
    """The run's results, rendered as `lanekeeper report` renders the same run's JUnit file and record."""
    reports = [str(state.report_dir / "stall-report.md")] if state.incidents and state.report_dir is not None else []
    summary = summarize(list(state.cases.values()), state.config.rootpath)
    return render(summary, "markdown", run_notes([run_record(state)], reports))


def only_skips(state: RunState) -> list[str] | None:
    """The skip reasons when every test of the run was skipped (a lane that ran nothing of what it
    claims, e.g. --backend vllm where vLLM does not import), else None."""
    totals = summarize(list(state.cases.values()))["totals"]
    if not totals["skipped"] or totals["passed"] or totals["failed"] or totals["stalled"]:
        return None
    return sorted({f"skipped: {c.message}" for c in state.cases.values()})


def pytest_sessionfinish(session, exitstatus):
    state = session.config.stash[RUN]
    if budget_exhausted(session.config):
        state.budget_hit = True
    if is_worker(session.config):
        session.config.workeroutput["lanekeeper_budget_hit"] = state.budget_hit
        return
    if state.budget_hit:   # red, and distinct from an interrupt or a CI job timeout
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if exitstatus == pytest.ExitCode.OK and only_skips(state):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if is_worker(config):
        return
    state = config.stash[RUN]
    skipped_all = only_skips(state)
    if skipped_all:
        terminalreporter.write_line("lanekeeper: every selected test was skipped, so this run is red: "
                                    + "; ".join(skipped_all), red=True)
    text = summary_markdown(state)
    if state.cases:
        terminalreporter.section("lanekeeper summary")
        terminalreporter.write(text)
    if state.report_dir is not None:
        state.report_dir.mkdir(parents=True, exist_ok=True)
        (state.report_dir / "matrix-summary.md").write_text(text)
        record.write(state.report_dir, run_record(state))
        if state.incidents:
            terminalreporter.write_line(f"stall report: {state.report_dir / 'stall-report.md'}")
