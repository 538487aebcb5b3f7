"""lanekeeper's pytest plugin.

Options
  --platform / --runner / --cuda-graph / --handoff   narrow the runner x graph x handoff matrix
  --profile NAME|PATH    the deploy profile every engine and server of the run resolves (a lane's
                         `profile:`); matrix cells override only their own axes on top of it
  --backend torch|vllm   the stage-0 backend the matrix runs on; cells a backend cannot run here
                         are skipped with the backend's own reason
  --report-dir DIR       where stall-report.{json,md} and matrix-summary.md go
  --lane-budget SECONDS  end the whole run cleanly before a CI job timeout would
  --shard K/N            run only the K-th of N shards: whole matrix cells, other tests one by one,
                         balanced by test count, the same split whatever the collection order

Under pytest-xdist (-n N) workers run the tests and the controller keeps the books: results,
stall incidents (carried on the reports) and a worker's exhausted budget reach it, so the
summary, stall report and exit status are those of a serial run.  With the default `--dist
load`, a matrix cell goes to one worker whole, so each cell's engine or server starts once.

Hooks, in the order a test meets them
  pytest_collection_modifyitems  keeps only --shard's part of the selection
  pytest_generate_tests    a test that takes `cell` runs once per selected cell; cells are
                           session-scoped, so one engine or server serves all of a cell's tests
  pytest_runtest_protocol  gives every test a hard timeout (pytest-timeout, signal method, so the
                           JUnit record survives): its own marker, else --timeout / PYTEST_TIMEOUT /
                           ini, else the default of its marker; never past the lane budget
  pytest_runtest_makereport  on a timeout or a watchdog diagnosis (StageHandoffStall, StageStall,
                           StageDied): dump the Python stacks of every engine process (faulthandler
                           on SIGUSR1 in each; py-spy too when installed), kill the engines, write
                           the stall report; later tests of a stalled cell fail at once
  pytest_runtest_teardown  any engine process that no open engine or server owns is killed, and
                           the test errors
  pytest_terminal_summary  the matrix (cell x task: passed / failed / stalled / skipped and why), printed
                           and written as Markdown for CI annotations
  pytest_sessionfinish     a run whose every test was skipped is red: it ran nothing it claims to
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pytest

from ci.argtypes import shard
from ci.junit import Case, render, summarize
from ci.matrix import CUDA_GRAPH, HANDOFFS, RUNNERS, cell_in, cells, task_of
from engine.config import BACKENDS
from engine.procs import describe_process, kill_processes

MARKER_TIMEOUTS = {"config": 60.0, "offline": 300.0, "online": 300.0, "gpu": 900.0}
DEFAULT_TIMEOUT = 600.0


def pytest_addoption(parser):
    group = parser.getgroup("lanekeeper")
    group.addoption("--platform", default=None, help="platform to resolve profiles for (default: detected)")
    group.addoption("--profile", default="qwen3_tts",
                    help="deploy profile (name or path) the engines and servers run (default: %(default)s)")
    group.addoption("--backend", choices=BACKENDS, default="torch",
                    help="stage-0 backend the matrix runs on (default: torch, the built-in talker)")
    group.addoption("--runner", choices=RUNNERS, action="append", help="only these model runners")
    group.addoption("--cuda-graph", choices=CUDA_GRAPH, action="append", help="only these CUDA graph modes")
    group.addoption("--handoff", choices=HANDOFFS, action="append", help="only these handoff modes")
    group.addoption("--report-dir", default=os.environ.get("LANEKEEPER_REPORT_DIR"),
                    help="directory for stall-report.json/.md and matrix-summary.md")
    group.addoption("--lane-budget", type=float, default=None, metavar="SECONDS",
                    help="stop the run cleanly once this many seconds have passed")
    group.addoption("--shard", type=shard, default=None, metavar="K/N",
                    help="run only shard K of N (a matrix cell is never split across shards)")


def selected_cells(config):
    return cells(config.getoption("runner") or RUNNERS, config.getoption("cuda_graph") or CUDA_GRAPH,
                 config.getoption("handoff") or HANDOFFS, config.getoption("backend"))


def unsupported_cells(config, chosen) -> dict[str, str]:
    """Cells the backend cannot run on this platform, with the backend's own reason (asked once a run)."""
    if config.getoption("backend") != "vllm":
        return {}
    lane = config.stash[LANE]
    if lane.unsupported is None:
        from engine.config import detect_platform, resolve
        from engine.vllm_talker import unsupported

        platform = config.getoption("platform") or detect_platform()
        lane.unsupported = {}
        for cell in chosen:
            reason = unsupported(resolve(config.getoption("profile"), platform=platform, overrides=cell.overrides))
            if reason:
                lane.unsupported[cell.id] = reason
    return lane.unsupported


def shipped_profile(config):
    """The run's profile as shipped: only the test watchdog and the run's stage-0 backend set on it."""
    from ci.matrix import TEST_WATCHDOG
    from engine.config import detect_platform, resolve

    backend = config.getoption("backend")
    return resolve(config.getoption("profile"), platform=config.getoption("platform") or detect_platform(),
                   overrides=TEST_WATCHDOG + ([f"backend={backend}"] if backend != "torch" else []))


def unit_of(nodeid: str) -> str:
    """What is never split across shards or workers: a matrix cell (its engine or server starts once); any
    other test is a unit of its own."""
    return cell_in(nodeid) or nodeid


def split(nodeids: list[str], shards: int) -> list[list[str]]:
    """The node ids of each shard.  Units (unit_of) go, largest first (ties by name), to the shard with the
    fewest tests so far: a pure function of the set of ids."""
    units: dict[str, list[str]] = {}
    for nodeid in nodeids:
        units.setdefault(unit_of(nodeid), []).append(nodeid)
    out: list[list[str]] = [[] for _ in range(shards)]
    for _, ids in sorted(units.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        min(out, key=len).extend(ids)   # min() takes the first of equals: the lowest shard
    return out


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    if config.getoption("shard") is None:
        return
    k, n = config.getoption("shard")
    keep = set(split([item.nodeid for item in items], n)[k - 1])
    config.hook.pytest_deselected(items=[item for item in items if item.nodeid not in keep])
    items[:] = [item for item in items if item.nodeid in keep]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Under -n with the default --dist load: a matrix cell is one unit of work (its session-scoped engine or
    server then starts on one worker only), any other test its own.  xdist's --dist loadgroup would do the
    grouping too, but it appends "@group" to every node id, and node ids are what JUnit, the summary and
    repro go by."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class CellScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    return CellScheduling(config, log)


def pytest_generate_tests(metafunc):
    if "shipped" in metafunc.fixturenames:
        lane = metafunc.config.stash[LANE]
        if lane.shipped is None:   # resolved (and asked of vLLM) once a run
            profile, marks = shipped_profile(metafunc.config), []
            if profile.config.backend == "vllm":
                from engine.vllm_talker import unsupported

                reason = unsupported(profile)
                marks = [pytest.mark.skip(reason=reason)] if reason else []
            # The id carries the cell the profile's own defaults make, so the matrix summary and repro see it.
            lane.shipped = pytest.param(profile, id=f"{profile.name}-{profile.cell}", marks=marks)
        metafunc.parametrize("shipped", [lane.shipped], scope="session")
    if "cell" in metafunc.fixturenames:
        chosen = selected_cells(metafunc.config)
        skips = unsupported_cells(metafunc.config, chosen)
        params = [pytest.param(c, id=c.id, marks=[pytest.mark.skip(reason=skips[c.id])] if c.id in skips else [])
                  for c in chosen]
        metafunc.parametrize("cell", params, scope="session")


@pytest.fixture(scope="session")
def platform(pytestconfig) -> str:
    from engine.config import detect_platform

    return pytestconfig.getoption("platform") or detect_platform()


@pytest.fixture(scope="session")
def profile_name(pytestconfig) -> str:
    """The deploy profile under test: a lane's `profile:` arrives here as --profile."""
    return pytestconfig.getoption("profile")


# ------------------------------------------------------------------ session state

class Lane:
    """What the plugin learns during one run."""

    def __init__(self, config):
        self.config = config
        self.started = time.monotonic()
        self.budget = config.getoption("lane_budget")
        self.budget_hit = False
        report_dir = config.getoption("report_dir")
        self.report_dir = Path(report_dir) if report_dir else None
        self.stack_dir = Path(tempfile.mkdtemp(prefix="lanekeeper-stacks-"))
        self.incidents: list[dict] = []
        self.stalled_cells: dict[str, str] = {}
        self.unsupported: dict[str, str] | None = None    # cell id -> why the backend cannot run it here
        self.shipped = None                                # the run's profile as shipped, as a test parameter
        self.cases: dict[str, Case] = {}                   # node id -> its result, as JUnit records it

    def remaining(self) -> float | None:
        return None if self.budget is None else self.budget - (time.monotonic() - self.started)


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"received signal {signum}")


def pytest_configure(config):
    # SIGTERM (a CI agent or `lanekeeper run` stopping the lane) ends the run like ^C: fixtures
    # close their engines and the JUnit file is still written.
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)
    from engine.config import ProfileError, find_profile

    try:
        find_profile(config.getoption("profile"))
    except ProfileError as e:
        raise pytest.UsageError(f"--profile: {e}") from None
    lane = Lane(config)
    config.stash[LANE] = lane
    config.pluginmanager.register(Books(lane), "lanekeeper-books")
    # Engine stages (here and in servers started from here) write faulthandler dumps to this directory.
    os.environ["LANEKEEPER_STACK_DIR"] = str(lane.stack_dir)


LANE = pytest.StashKey[Lane]()


# ------------------------------------------------------------------ timeouts and budget

def _configured_timeout(config) -> float | None:
    for value in (config.getoption("timeout", None), os.environ.get("PYTEST_TIMEOUT"), _ini(config)):
        if value not in (None, ""):
            return float(value)
    return None


def _ini(config):
    try:
        return config.getini("timeout")
    except ValueError:
        return None


def timeout_for(item) -> float:
    marker = item.get_closest_marker("timeout")
    if marker is not None:
        return float(marker.args[0] if marker.args else marker.kwargs.get("timeout", DEFAULT_TIMEOUT))
    configured = _configured_timeout(item.config)
    if configured is not None:
        return configured
    return min([t for m, t in MARKER_TIMEOUTS.items() if item.get_closest_marker(m)] or [DEFAULT_TIMEOUT])


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    lane = item.config.stash[LANE]
    left = lane.remaining()
    if left is not None and left <= 0:
        lane.budget_hit = True
        item.session.shouldstop = f"lane budget of {lane.budget:.0f}s exhausted"
        return (yield)
    timeout = timeout_for(item)
    if left is not None:
        timeout = max(1.0, min(timeout, left))
    item.add_marker(pytest.mark.timeout(timeout, method="signal"))
    item.stash[STARTED] = time.time()
    try:
        return (yield)
    except KeyboardInterrupt as e:
        # ^C or SIGTERM mid-test: the test it cut short still gets a JUnit record, an error that says so
        # (pytest's JUnit writer records only phases that finished).
        from _pytest.reports import TestReport

        item.ihook.pytest_runtest_logreport(report=TestReport(
            item.nodeid, item.location, {k: 1 for k in item.keywords}, "failed",
            f"interrupted: {e or 'KeyboardInterrupt'}; the run stopped here and still wrote its reports", "call"))
        raise


STARTED = pytest.StashKey[float]()


def pytest_runtest_setup(item):
    lane = item.config.stash[LANE]
    cell = _cell_of(item)
    if cell and cell in lane.stalled_cells:
        pytest.fail(f"cell {cell} already stalled in this run: {lane.stalled_cells[cell]}", pytrace=False)


# ------------------------------------------------------------------ stalls and timeouts

def _cell_of(item) -> str | None:
    """The matrix cell a test runs in: its `cell`, or the cell its profile as shipped makes."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    if "shipped" in params:
        return params["shipped"].cell
    return getattr(params.get("cell"), "id", None)


def diagnoses_in(exc) -> list[dict]:
    """Watchdog diagnoses carried by an exception or its causes (engine errors, OpenAI API errors)."""
    from engine.errors import WATCHDOG_KINDS

    found, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        error = getattr(exc, "error", None)
        if isinstance(error, dict) and error.get("kind") in WATCHDOG_KINDS:
            found.append(error)
        body = getattr(exc, "body", None)
        if isinstance(body, dict):
            body = body.get("error", body)
            diag = body.get("diagnosis") if isinstance(body, dict) else None
            if isinstance(diag, dict) and diag.get("kind") in WATCHDOG_KINDS:
                found.append(diag)
        exc = exc.__cause__ or exc.__context__
    return found


def _engine_processes() -> list[psutil.Process]:
    procs = []
    for proc in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(proc.cmdline())
        except psutil.Error:
            continue
        if ("multiprocessing.spawn" in cmd and "resource_tracker" not in cmd) or "ci.cli serve" in cmd \
                or cmd.startswith("VLLM::"):   # vLLM's engine core and workers, after setproctitle
            procs.append(proc)
    return procs


def dump_stacks(lane: Lane) -> dict[str, str]:
    """SIGUSR1 every engine process (faulthandler writes its stacks), then collect; py-spy when present."""
    from engine.procs import STACK_DUMP_SIGNAL, stack_file

    procs = _engine_processes()
    for proc in procs:
        try:
            os.kill(proc.pid, STACK_DUMP_SIGNAL)
        except ProcessLookupError:
            pass
    time.sleep(0.5)
    stacks = {}
    py_spy = shutil.which("py-spy")
    for proc in procs:
        path = Path(stack_file(str(lane.stack_dir), proc.pid))
        text = path.read_text() if path.exists() else ""
        if py_spy:
            try:
                text += "\n# py-spy dump\n" + subprocess.run([py_spy, "dump", "--pid", str(proc.pid)], text=True,
                                                            capture_output=True, timeout=10).stdout
            except (subprocess.SubprocessError, OSError):
                pass
        try:
            role = describe_process(proc.name(), " ".join(proc.cmdline()))
        except psutil.Error:
            role = "exited"
        stacks[f"{role}, pid {proc.pid}"] = text or "(no stack dump received)"
    return stacks


def kill_engines() -> None:
    from ci.remote_server import _LIVE as servers
    from engine.engine import _LIVE as engines

    for engine in list(engines):
        engine.close(timeout=0.5)
    for server in list(servers):
        server.kill()
    kill_processes(_engine_processes())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    lane = item.config.stash[LANE]
    cell, task = _cell_of(item), task_of(item.nodeid)
    if report.when == "call" or (report.when == "setup" and (report.failed or report.skipped)):
        incident = None
        if report.failed and call.excinfo is not None:
            from engine.watchdog import DIAGNOSES

            exc = call.excinfo.value
            started = item.stash.get(STARTED, time.time())
            found = diagnoses_in(exc) or [d for t, d in list(DIAGNOSES) if t >= started]
            if "from pytest-timeout" in str(exc):
                incident = {"kind": "Timeout", "message": str(exc).strip().splitlines()[0]}
            elif found:
                incident = dict(found[0])
            if incident is not None:
                incident.update(test=item.nodeid, cell=cell, task=task, phase=report.when,
                                seconds=round(call.duration, 2),
                                diagnoses=found, stacks=dump_stacks(lane))
                kill_engines()
                if cell:
                    lane.stalled_cells[cell] = incident.get("message", incident["kind"])
                # On the report, so that it reaches the books wherever they are kept (an xdist controller
                # included: reports cross as plain JSON values).
                report.lanekeeper_incident = json.loads(json.dumps(incident, default=str))
                first = incident.get("message") or incident["kind"]   # the diagnosis, in words, leads the failure
                report.longrepr = f"{first}\n\n{report.longreprtext}"
    return report


def is_worker(config) -> bool:
    return hasattr(config, "workerinput")


class Books:
    """The run's results, from the reports: kept where the run is reported (the only process, or the xdist
    controller), as pytest's JUnit writer keeps them."""

    def __init__(self, lane: Lane):
        self.lane = lane

    def pytest_runtest_logreport(self, report):
        lane = self.lane
        if is_worker(lane.config):
            return
        if report.when == "call" or (report.when == "setup" and (report.failed or report.skipped)) \
                or (report.when == "teardown" and report.failed):   # JUnit marks the test an error then
            lane.cases[report.nodeid] = _case(report)
        incident = getattr(report, "lanekeeper_incident", None)
        if incident is not None:
            lane.incidents.append(incident)
            if incident.get("cell"):
                lane.stalled_cells[incident["cell"]] = incident.get("message", incident["kind"])
            write_stall_report(lane)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error):
        if getattr(node, "workeroutput", {}).get("lanekeeper_budget_hit"):
            self.lane.budget_hit = True


def _case(report) -> Case:
    """A report as pytest's JUnit writer records it (same status, same message), so that the summary
    made here and the one `lanekeeper report` makes from the JUnit file agree."""
    if report.passed:
        return Case.from_nodeid(report.nodeid, "passed", "")
    if report.skipped:   # longrepr is (file, line, "Skipped: <reason>")
        return Case.from_nodeid(report.nodeid, "skipped", str(report.longrepr[2]).removeprefix("Skipped: "))
    crash = getattr(report.longrepr, "reprcrash", None)
    reason = crash.message if crash is not None else str(report.longrepr)
    if report.when == "call":
        return Case.from_nodeid(report.nodeid, "failed", f"{reason}\n{report.longrepr}")
    return Case.from_nodeid(report.nodeid, "error", f'failed on {report.when} with "{reason}"\n{report.longrepr}')


def write_stall_report(lane: Lane) -> None:
    if lane.report_dir is None:
        return
    lane.report_dir.mkdir(parents=True, exist_ok=True)
    (lane.report_dir / "stall-report.json").write_text(json.dumps(lane.incidents, indent=2, default=str))
    lines = ["# Stall report", ""]
    for inc in lane.incidents:
        lines += [f"## {inc['kind']} in `{inc['test']}`", "",
                  f"- cell: `{inc.get('cell') or '-'}`, task: {inc.get('task')}",
                  f"- after {inc['seconds']} s: {inc.get('message', '')}"]
        if "stage" in inc:
            lines.append(f"- stage {inc['stage']} ({inc.get('stage_name')}), request(s) "
                         f"{', '.join(inc.get('request_ids', [])) or inc.get('request_id', '')}; frames produced "
                         f"{inc.get('frames_produced')}, handed off {inc.get('frames_handed_off')}, consumed "
                         f"{inc.get('frames_consumed')}")
        for proc, stack in inc["stacks"].items():
            lines += ["", f"<details><summary>stacks of {proc}</summary>", "", "```", stack.strip(), "```",
                      "</details>"]
        lines.append("")
    (lane.report_dir / "stall-report.md").write_text("\n".join(lines))


# ------------------------------------------------------------------ process guard

def _stray_engine_processes() -> list[psutil.Process]:
    """Engine (or server) processes that no open engine or live server owns."""
    from ci.remote_server import live_server_pids
    from engine.engine import live_engine_pids

    owned = live_engine_pids() | live_server_pids()
    stray = []
    for proc in _engine_processes():
        try:
            if proc.pid in owned or proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if any(p.pid in owned for p in proc.parents()):
                continue
            stray.append(proc)
        except psutil.NoSuchProcess:
            continue
    return stray


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    result = yield
    stray = _stray_engine_processes()
    if stray:
        desc = ", ".join(f"pid {p.pid}" for p in stray)
        kill_processes(stray)
        raise AssertionError(f"engine processes outlived {item.nodeid} (killed now): {desc}")
    return result


# ------------------------------------------------------------------ summary

def summary_markdown(lane: Lane) -> str:
    """The run's results, rendered as `lanekeeper report` renders the same run's JUnit file."""
    notes = []
    if lane.stalled_cells:
        notes.append(f"Stalled cells: {', '.join(sorted(lane.stalled_cells))}")
    if lane.incidents and lane.report_dir is not None:
        notes.append(f"Stall report: {lane.report_dir / 'stall-report.md'}")
    if lane.budget_hit:
        notes.append(f"Lane budget of {lane.budget:.0f}s exhausted: the run stopped early.")
    return render(summarize(list(lane.cases.values())), "markdown", notes)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if is_worker(config):
        return
    lane = config.stash[LANE]
    skipped_all = only_skips(lane)
    if skipped_all:
        terminalreporter.write_line("lanekeeper: every selected test was skipped, so this run is red: "
                                    + "; ".join(skipped_all), red=True)
    text = summary_markdown(lane)
    if lane.cases:
        terminalreporter.section("lanekeeper summary")
        terminalreporter.write(text)
    if lane.report_dir is not None:
        lane.report_dir.mkdir(parents=True, exist_ok=True)
        (lane.report_dir / "matrix-summary.md").write_text(text)
        if lane.incidents:
            terminalreporter.write_line(f"stall report: {lane.report_dir / 'stall-report.md'}")


def only_skips(lane: Lane) -> list[str] | None:
    """The skip reasons when every test of the run was skipped (a lane that ran nothing of what it
    claims, e.g. --backend vllm where vLLM does not import), else None."""
    totals = summarize(list(lane.cases.values()))["totals"]
    if not totals["skipped"] or totals["passed"] or totals["failed"] or totals["stalled"]:
        return None
    return sorted({f"skipped: {c.message}" for c in lane.cases.values()})


def pytest_sessionfinish(session, exitstatus):
    lane = session.config.stash[LANE]
    if is_worker(session.config):
        session.config.workeroutput["lanekeeper_budget_hit"] = lane.budget_hit
    if lane.budget_hit:   # red, and distinct from an interrupt or a CI job timeout
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if exitstatus == pytest.ExitCode.OK and only_skips(lane):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    shutil.rmtree(lane.stack_dir, ignore_errors=True)
