"""The command line's basics: a version, help on every option, and quiet when its reader goes away."""
import argparse
import subprocess
import sys
from pathlib import Path

from ci.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[2]


def _options(parser, path):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _options(sub, path + [name])
        elif not isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            yield " ".join(path), "/".join(action.option_strings) or action.dest, action.help


def test_every_option_says_what_it_does():
    missing = [f"{cmd} {opt}" for cmd, opt, text in _options(build_parser(), ["lanekeeper"]) if not text]
    assert not missing, f"options without help text: {missing}"


def test_version(capsys):
    from importlib.metadata import version

    try:
        main(["--version"])
    except SystemExit as e:
        assert e.code == 0
    assert capsys.readouterr().out.strip() == f"lanekeeper {version('lanekeeper')}"


def test_a_reader_that_goes_away_gets_no_traceback():
    """`lanekeeper pipeline buildkite | head -1`: the reader closes before the write; no traceback."""
    cmd = [sys.executable, "-m", "ci.cli", "pipeline", "buildkite", "--event", "push"]
    for _ in range(3):
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        proc.stdout.close()            # the reader is gone before anything is written
        err = proc.stderr.read().decode()
        proc.stderr.close()
        assert proc.wait(timeout=60) == 141 and "Traceback" not in err, err


def test_main_lets_an_interrupt_through(monkeypatch):
    """In-process callers (tests, the plugin's SIGTERM) see their interrupt; only the program maps it to 130."""
    import pytest

    from ci import cli

    from ci.run import commands as lane_commands

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(lane_commands, "cmd_lanes", interrupted)
    with pytest.raises(KeyboardInterrupt):
        cli.main(["lanes"])
    monkeypatch.setattr(sys, "argv", ["lanekeeper", "lanes"])
    assert cli.entry() == 130


def _name(proc) -> str:
    """A process's name, or "" once it is gone (children come and go while the lane starts)."""
    import psutil

    try:
        return proc.name()
    except psutil.Error:
        return ""


def _engine_is_up(tree) -> bool:
    return len([p for p in tree if _name(p).startswith("lk")]) >= 2


def _sigterm_once_up(cmd: list[str], settle: float = 0.0, timeout: float = 30, ready=_engine_is_up):
    """Start cmd, wait until `ready(its process tree)` (by default: an engine's two stages run under it),
    let it settle, then SIGTERM it.  Returns its exit code, its output, the process tree it had, and the
    seconds it took to exit."""
    import signal
    import time

    import psutil

    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        root = psutil.Process(proc.pid)
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            if ready(root.children(recursive=True)):
                break
            time.sleep(0.2)
        assert proc.poll() is None, f"{cmd} ended before it was ready to be stopped"
        tree = root.children(recursive=True)
        time.sleep(settle)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=timeout)
        elapsed = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        output = proc.stdout.read().decode(errors="replace")
        proc.stdout.close()
    return code, output, tree, elapsed


def test_sigterm_to_a_running_lane_leaves_junit_and_its_own_status(tmp_path):
    """A cancelled CI job: SIGTERM mid-test, then the lane has 10 s before SIGKILL. It needs far less."""
    import xml.etree.ElementTree as ET

    import psutil

    from tests.helpers.lanes import one_lane_file

    lanes_file = one_lane_file(tmp_path, "long", "batch_of_32 or streaming_equals")
    art = tmp_path / "art"
    code, output, tree, elapsed = _sigterm_once_up(
        [sys.executable, "-m", "ci.cli", "run", "long", "--lanes-file", str(lanes_file), "--artifacts", str(art)],
        settle=1.0)
    assert elapsed < 8, output[-3000:]
    assert code == 2, output[-3000:]                   # pytest's own "interrupted", not a signal death
    cases = list(ET.parse(art / "junit.xml").getroot().iter("testcase"))
    assert cases, "the JUnit file has no test cases"
    cut = [c for c in cases if c.find("failure") is not None or c.find("error") is not None]
    assert len(cut) == 1 and "interrupted: received signal 15" in ET.tostring(cut[0], encoding="unicode")
    assert not [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_sigterm_to_lane_scaling_stops_the_lanes_it_started(tmp_path):
    """The benchmark runs lanes of its own; stopped mid-lane, it stops them and leaves nothing running."""
    import signal

    from tests.helpers.lanes import one_lane_file
    from tests.helpers.procs import gone

    lanes_file = one_lane_file(tmp_path, "long", "batch_of_32 or streaming_equals")
    code, output, tree, _ = _sigterm_once_up(
        [sys.executable, "benchmarks/lane_scaling.py", "long", "--lanes-file", str(lanes_file)], timeout=60)
    assert code == 128 + signal.SIGTERM, output[-3000:]
    assert gone([p.pid for p in tree]), [p for p in tree if p.is_running()]


def test_sigterm_to_the_online_benchmark_ends_its_server():
    """Stopped mid-level (a job's time limit, say), the benchmark ends the server it started and the
    server's engine, instead of leaving them serving on."""
    import signal

    from tests.helpers.procs import gone

    code, output, tree, _ = _sigterm_once_up(
        [sys.executable, "benchmarks/online_serving.py", "--runner", "v2", "--concurrency", "1"], settle=2, timeout=60)
    assert code == 128 + signal.SIGTERM, output[-3000:]
    assert gone([p.pid for p in tree]), [p for p in tree if p.is_running()]


def test_sigterm_to_the_cpu_timing_benchmark_ends_the_suite_it_runs(tmp_path):
    """It times the test command of `.ci/run` in a session of its own: stopped, it ends that suite,
    pytest-xdist's workers and all, instead of leaving it running with nobody to read its result."""
    import signal

    from tests.helpers.procs import gone

    workers_up = lambda tree: sum(_name(p).startswith("python") for p in tree) >= 4   # pytest and 3 workers
    code, output, tree, _ = _sigterm_once_up(
        [sys.executable, "benchmarks/cpu_timing.py", "--only", "tests", "--json", str(tmp_path / "cpu.json")],
        ready=workers_up, timeout=90)
    assert code == 128 + signal.SIGTERM, output[-3000:]
    assert gone([p.pid for p in tree]), [p for p in tree if p.is_running()]
