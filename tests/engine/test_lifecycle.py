"""Engine processes: one group, always ended, even when a test fails or a stage wedges."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from engine.profile.resolve import resolve
from engine.runtime.engine import TTSEngine
from engine.request import SpeechRequest
from tests.helpers.procs import gone


@pytest.fixture
def profile():
    return resolve("qwen3_tts", platform="cpu")


def test_stages_share_one_process_group(profile):
    with TTSEngine(profile) as engine:
        pids = engine.pids()
        assert len(pids) == 2
        assert {os.getpgid(p) for p in pids} == {pids[0]} != {os.getpgid(0)}
    assert gone(pids)


def test_failure_mid_generation_leaves_nothing(profile):
    pids = []
    with pytest.raises(RuntimeError, match="boom"):
        with TTSEngine(profile) as engine:
            pids = engine.pids()
            for chunk in engine.stream(SpeechRequest("a long sentence " * 8)):
                raise RuntimeError("boom")
    assert pids and gone(pids)


def test_close_after_work_ends_the_stages_by_themselves(profile):
    """Stop reaches stage 1 through stage 0's handoff queue: both stages exit on their own (code 0), not
    by the kill close() falls back on once its timeout has passed."""
    engine = TTSEngine(profile)
    engine.generate([SpeechRequest("Hello.")])
    t0 = time.monotonic()
    engine.close()
    assert [p.exitcode for p in engine.procs] == [0, 0], time.monotonic() - t0


def test_stages_start_from_the_engines_environment_not_the_fork_servers(profile, tmp_path, monkeypatch):
    """Stages fork from a server started with the first engine; a later engine's stages must still see
    the environment and working directory of the moment it starts them, as spawned ones would."""
    from engine.process.stacks import STACK_DIR_ENV, STACK_DUMP_SIGNAL, stack_file

    with TTSEngine(profile):   # the fork server is up from here on
        pass
    monkeypatch.setenv(STACK_DIR_ENV, str(tmp_path))
    monkeypatch.chdir(tmp_path)
    with TTSEngine(profile) as engine:
        pid = engine.pids()[1]
        assert os.readlink(f"/proc/{pid}/cwd") == str(tmp_path)
        os.kill(pid, STACK_DUMP_SIGNAL)
        deadline = time.monotonic() + 10
        while "stage1" not in _read(stack_file(str(tmp_path), pid)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "stage1" in _read(stack_file(str(tmp_path), pid))


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return ""


def test_wedged_stage_is_killed(profile):
    engine = TTSEngine(profile)
    pids = engine.pids()
    os.kill(pids[0], signal.SIGSTOP)   # stage 0 can no longer answer "stop"
    t0 = time.monotonic()
    engine.close(timeout=1.0)
    assert time.monotonic() - t0 < 10
    assert gone(pids)


def test_dead_stage_fails_requests_instead_of_hanging(profile):
    with TTSEngine(profile) as engine:
        os.kill(engine.pids()[1], signal.SIGKILL)
        (result,) = engine.generate([SpeechRequest("Nobody decodes this.")], timeout=30)
        assert result.status == "finished_error"
        assert result.error.kind == "StageDied" and result.error.stage == 1


def test_orphaned_stages_exit(tmp_path):
    """If the process that owns the engine dies without closing it, the stages notice and exit."""
    script = textwrap.dedent("""
        import os, sys
        from engine.profile.resolve import resolve
        from engine.runtime.engine import TTSEngine
        if __name__ == "__main__":
            engine = TTSEngine(resolve("qwen3_tts", platform="cpu"))
            print(*engine.pids(), flush=True)
            os._exit(0)
    """)
    # its own TMPDIR: killed this way, the owner cannot remove its fork server's socket folder
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
                         env={**os.environ, "TMPDIR": str(tmp_path)})
    pids = [int(p) for p in out.stdout.split()]
    assert len(pids) == 2, out.stderr
    try:
        assert gone(pids, timeout=15)
    finally:
        for p in pids:
            try:
                os.killpg(p, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def test_guard_fails_a_test_that_leaks_an_engine(pytester):
    pytester.makepyfile(test_leak="""
        from engine.profile.resolve import resolve
        from engine.runtime.engine import TTSEngine
        from engine.runtime.registry import REGISTRY

        def test_leaks():
            engine = TTSEngine(resolve("qwen3_tts", platform="cpu"))
            REGISTRY.unregister(engine)    # forget it, as a buggy test would
            engine._finalizer.detach()
            print("PIDS", *engine.pids())

        def test_next():
            pass
    """)
    result = pytester.runpytest_subprocess("-s")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["*engine processes outlived*test_leaks*killed now*"])
    line = next(l for l in result.outlines if "PIDS" in l)
    assert gone([int(p) for p in line.split("PIDS")[1].split()])


def test_processes_say_what_they_are():
    from engine.process.tree import describe_process

    assert describe_process("lk1:code2wav", "python3 -c from multiprocessing.spawn import spawn_main") == \
        "stage 1 (code2wav)"
    assert describe_process("VLLM::EngineCor", "VLLM::EngineCore") == "vLLM engine core"
    assert describe_process("lk-serve", "python3 -m engine.serve --port 1") == "speech server"
    assert describe_process("python3", "python3 -m pytest") is None


@pytest.mark.parametrize("closes", [True, False], ids=["closed", "left_open"])
def test_a_program_that_used_an_engine_leaves_nothing_when_it_exits(tmp_path, closes):
    """The fork server the stages fork from, and every stage, end with the program that started them, and
    promptly, whether or not it closed its engine."""

    import psutil

    script = tmp_path / "use_engine.py"
    use = ("    with TTSEngine(resolve('qwen3_tts', platform='cpu')) as e:\n        e.generate([SpeechRequest('One line.')])\n"
           if closes else "    e = TTSEngine(resolve('qwen3_tts', platform='cpu'))\n    e.generate([SpeechRequest('One line.')])\n")
    script.write_text("from engine.profile.resolve import resolve\nfrom engine.runtime.engine import TTSEngine\n"
                      "from engine.request import SpeechRequest\n\nif __name__ == '__main__':\n" + use)
    proc = subprocess.Popen([sys.executable, str(script)], start_new_session=True, stderr=subprocess.PIPE, text=True)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    assert proc.returncode == 0, err

    def left():   # the program led a session of its own: whatever is still in it, it left behind
        out = []
        for p in psutil.process_iter():
            try:
                if os.getsid(p.pid) == proc.pid:
                    out.append(p.pid)
            except (ProcessLookupError, PermissionError, psutil.Error):
                pass
        return out

    deadline = time.monotonic() + 5
    while left() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left() == []
