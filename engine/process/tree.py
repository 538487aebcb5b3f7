"""The engine's processes as the operating system sees them: naming them, finding them, ending them."""
from __future__ import annotations

import os
import re
import signal
import sys
import time

STAGE_TITLE = re.compile(r"^lk(\d):(.*)$")
SERVER_TITLE = "lk-serve"


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
    _wait_ended(victims, timeout)


def unwind_on_sigterm() -> None:
    """SIGTERM leaves this program through its with-blocks and finally clauses, with status 143, as ^C
    does: by default it ends the program on the spot, and a speech server or lane it started runs on.
    For a program's main thread."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))


def _wait_ended(procs, timeout: float) -> None:
    """Reap our own children and wait for the others to have ended (see `ended`)."""
    import psutil

    deadline = time.monotonic() + timeout
    while procs:
        _, procs = psutil.wait_procs(procs, timeout=0.02)
        procs = [p for p in procs if not ended(p)]
        if time.monotonic() > deadline:
            return


def ended(proc) -> bool:
    """Exited, or exited and not yet reaped (a zombie), or its pid reused by another process.  A killed
    process that is not our child stays a zombie until its parent, or the init that adopted it, reaps it:
    dead, holding nothing but its pid, and, under a slow init, there for seconds after it died."""
    import psutil

    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


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
    if name == SERVER_TITLE:
        return "speech server"
    return None
