"""Stage process entry point, and the processes' plumbing: starting, naming, killing."""
from __future__ import annotations

import atexit
import faulthandler
import multiprocessing as mp
import multiprocessing.util  # noqa: F401  its exit handler (which removes the fork server's folder) must run after ours
import os
import re
import signal
import sys
import time

STACK_DUMP_SIGNAL = signal.SIGUSR1


STAGE_MODULES = ["engine.stage0", "engine.stage1"]


def stage_context():
    """Stages fork from multiprocessing's fork server, which imports torch and the stage code once: a
    spawned stage spends about 2.4 CPU-s importing them, and a CI lane starts engines by the hundred.
    The server, like multiprocessing's resource tracker, ends when the process that started it does."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(STAGE_MODULES)
    return ctx


@atexit.register
def _stop_fork_server() -> None:
    """At exit, end the fork server (if this process started one) and wait for it, so that nothing this
    process started outlives it.  (Killed outright, the process still ends it: the server exits when
    its pipe from here closes.)"""
    from multiprocessing import forkserver

    forkserver._forkserver._stop()


def kill_tree(roots, group: int | None = None, timeout: float = 5.0) -> None:
    """SIGKILL each root (a pid or a psutil.Process) with everything under it, and the process group
    `group`, then reap them.  Gone ones are fine.  The one way anything here is ended by force: the
    engine, the server fixture, the lane runner and the test plugin all end processes through it."""
    import psutil

    victims = []
    for root in roots:
        try:
            proc = root if isinstance(root, psutil.Process) else psutil.Process(root)
            victims += [proc, *proc.children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
    if group:
        try:
            os.killpg(group, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for proc in victims:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(victims, timeout=timeout)


def tree_pids(roots: list[int]) -> list[int]:
    """The pids of these processes and of everything under them (gone ones left out)."""
    import psutil

    out = []
    for pid in roots:
        try:
            out += [pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))]
        except psutil.Error:
            pass
    return out


def close_queues(*queues) -> None:
    """Close multiprocessing queues without waiting on a reader that is gone."""
    for q in queues:
        q.cancel_join_thread()   # a feeder blocked on a pipe nobody reads must not hold up close...
        q.close()
        feeder = getattr(q, "_thread", None)
        if feeder is not None:   # ...but one that is only finishing gets a moment: it holds the queue's
            feeder.join(1.0)     # semaphores, and a daemon thread cut off at exit leaks them


class ClosedQueue:
    """Stands in for a closed queue: any use raises `error(message)`."""

    def __init__(self, message: str, error=RuntimeError):
        self.message, self.error = message, error

    def put(self, item):
        raise self.error(self.message)

    def get(self, *a, **kw):
        raise self.error(self.message)


def engine_processes() -> list:
    """This process's descendants that belong to an engine: stages, vLLM's engine core and workers,
    speech servers (as `describe_process` knows them)."""
    import psutil

    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if describe_process(proc.name(), " ".join(proc.cmdline())) is not None:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def join_group(leader_pid: int | None) -> None:
    """Stage 0 leads a new process group; every other stage (and its children) joins it."""
    if leader_pid is None:
        os.setpgid(0, 0)
        return
    deadline = time.monotonic() + 10
    while True:
        try:
            os.setpgid(0, leader_pid)
            return
        except PermissionError:   # the leader has not made its group yet
            if time.monotonic() > deadline:
                raise
            time.sleep(0.005)


STACK_DIR_ENV = "LANEKEEPER_STACK_DIR"


def stack_file(stack_dir: str, pid: int) -> str:
    return os.path.join(stack_dir, f"stacks-{pid}.txt")


STAGE_TITLE = re.compile(r"^lk(\d):(.*)$")


def name_process(title: str) -> None:
    """Set this process's name as `ps`, psutil and stack reports see it (Linux keeps 15 bytes)."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_NAME = 15
        ctypes.CDLL(None).prctl(PR_SET_NAME, title.encode()[:15], 0, 0, 0)


def describe_process(name: str, cmdline: str) -> str | None:
    """What a process of an engine is, from its name and command line: stage N (its name), vLLM's engine
    core or worker, the speech server; None for any other process."""
    stage = STAGE_TITLE.match(name)
    if stage:
        return f"stage {stage.group(1)} ({stage.group(2)})"
    if "VLLM::EngineCore" in cmdline or name.startswith("VLLM::Engine"):
        return "vLLM engine core"
    if "VLLM::Worker" in cmdline or name.startswith("VLLM::Worke"):
        return "vLLM worker"
    if "ci.cli serve" in cmdline or "lanekeeper serve" in cmdline:
        return "speech server"
    return None


class Owner:
    """The engine's process, as its stages watch it.  Not a stage's parent: that is the fork server,
    which lives on while any stage does."""

    def __init__(self, pid: int):
        import psutil

        try:
            self.proc = psutil.Process(pid)
        except psutil.NoSuchProcess:
            self.proc = None

    def gone(self) -> bool:
        """Exited, or exited and not yet reaped (a zombie), or its pid reused by another process."""
        import psutil

        try:
            return self.proc is None or not self.proc.is_running() or self.proc.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True


def stage_main(stage_id: int, leader_pid: int | None, profile, queues, owner_pid: int, faults,
               origin: tuple[dict, str]) -> None:
    """`origin` is the engine's environment and working directory when it started the stage: a forked
    stage would otherwise see the fork server's, from whenever that started."""
    name_process(f"lk{stage_id}:{profile.stage_name(stage_id)}")
    environ, cwd = origin
    os.environ.clear()
    os.environ.update(environ)
    os.chdir(cwd)
    join_group(leader_pid)
    # SIGUSR1 dumps every thread's Python stack, to a file the test plugin reads when one is set.
    stack_dir = os.environ.get(STACK_DIR_ENV)
    out = open(stack_file(stack_dir, os.getpid()), "w") if stack_dir and os.path.isdir(stack_dir) else sys.stderr
    faulthandler.register(STACK_DUMP_SIGNAL, file=out, all_threads=True)
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # the engine, not ^C, ends stages
    for q in queues[1:]:   # what this stage sends: its exit must never wait for a reader to drain it
        q.cancel_join_thread()
    if stage_id == 0:
        from engine.stage0 import run
    else:
        from engine.stage1 import run
    run(profile, queues, Owner(owner_pid), faults)
