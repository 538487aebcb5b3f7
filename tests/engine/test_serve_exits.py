"""`lanekeeper serve` ends with a status an orchestrator can act on, and one line saying why: an address in
use (5) is found before the engine starts, and an engine that never started (3) is not a crash.  (The
plugin fails a test that leaves an engine process behind.)"""
import socket
import subprocess
import sys


def _serve(*args):
    return subprocess.run([sys.executable, "-m", "engine.serve", "--platform", "cpu", *args], capture_output=True,
                          text=True, timeout=120)


def test_an_address_in_use_is_status_5_before_any_engine():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run = _serve("--port", str(port))
    errors = [line for line in run.stderr.splitlines() if line.startswith("lanekeeper:")]
    assert run.returncode == 5 and len(errors) == 1 and str(port) in errors[0], run.stderr
    assert "Traceback" not in run.stderr and "stage" not in run.stderr   # no engine was started


def test_an_engine_that_never_starts_is_status_3(tmp_path):
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    junk = tmp_path / "junk.safetensors"   # a file, so the profile resolves; not a checkpoint, so stage 0 fails
    junk.write_bytes(b"not a checkpoint")
    run = _serve("--port", str(port), "--set", f"model.checkpoint={junk}")
    errors = [line for line in run.stderr.splitlines() if line.startswith("lanekeeper:")]
    assert run.returncode == 3 and len(errors) == 1 and "start" in errors[0], run.stderr
    assert "Traceback" not in run.stderr.split(errors[0])[1]   # the last word is the one line, not a traceback
