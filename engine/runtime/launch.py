"""Starting the stage processes: forked from multiprocessing's fork server, in one process group."""
from __future__ import annotations

import atexit
import multiprocessing as mp
import multiprocessing.util  # noqa: F401  its exit handler (which removes the fork server's folder) must run after ours
import os
import signal

from engine.process.owner import Owner, join_group
from engine.process.stacks import dump_stacks_on_signal
from engine.process.tree import name_process
from engine.runtime.registry import REGISTRY

# Each stage's module, whose `run` the stage process runs (`_stage_run`).  Named here, imported there: they
# import torch, which the process starting the engine (a client, the server, a pytest run) does not need;
# the fork server imports them once, and the stages it forks find them imported.
STAGES = ("engine.stage0.process", "engine.stage1.process")
# What stage 0 on vLLM imports on top (engine/stage0/vllm_backend.py): about 7 CPU-s a start on a 2-core machine,
# half of a warm vLLM start.  Imported once by the fork server of a process whose first engine runs on vLLM.
VLLM = ("vllm", "vllm.engine.arg_utils", "vllm.sampling_params", "vllm.v1.engine.llm_engine")


def _stage_run(stage_id: int):
    if stage_id == 0:
        from engine.stage0.process import run
        return run
    from engine.stage1.process import run
    return run


def stage_context(backend: str):
    """Stages fork from multiprocessing's fork server, which imports torch and the stage code once: a
    spawned stage spends about 2.4 CPU-s importing them, and a CI lane starts engines by the hundred.
    The server, like multiprocessing's resource tracker, ends when the process that started it does.
    What it imports is fixed when the first engine of the process starts it; a module it cannot import
    (vLLM, where it is not installed) it leaves to the stage."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(STAGES) + (list(VLLM) if backend == "vllm" else []))
    return ctx


@atexit.register
def _stop_fork_server() -> None:
    """At exit, end the engines still open (a program that never closed one) and then the fork server (if
    this process started one), and wait for it, so that nothing this process started outlives it.  The
    server waits for the stages it forked, so they go first: the engines' own exit-time finalizers may
    run after this, depending on what was imported when.  (Killed outright, the process still ends it
    all: the server exits when its pipe from here closes, and the stages watch the engine's process.)

    `_forkserver._stop` is multiprocessing's private name; nothing public stops the server, and
    tests/engine/test_lifecycle.py checks that a program's exit leaves no process.  The server is killed
    before it is waited for: asked to stop, it would tear down the torch it imported, which costs every
    process that started an engine about a second at exit (`_forkserver_pid` is as private as `_stop`).  It is
    this process's unreaped child, so the pid cannot have gone to another process."""
    from multiprocessing import forkserver

    REGISTRY.kill_all()
    server = forkserver._forkserver
    if server._forkserver_pid is not None:
        os.kill(server._forkserver_pid, signal.SIGKILL)
    server._stop()


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
    dump_stacks_on_signal()
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # the engine, not ^C, ends stages
    for q in queues[1:]:   # what this stage sends: its exit must never wait for a reader to drain it
        q.cancel_join_thread()
    _stage_run(stage_id)(profile, queues, Owner(owner_pid), faults)


def start_stages(ctx, profile, queues, faults) -> list:
    """Both stage processes, started: stage 0 leads the process group, stage 1 joins it."""
    procs: list = []
    for stage, role in enumerate(("talker", "code2wav")):
        leader = procs[0].pid if procs else None
        procs.append(ctx.Process(target=stage_main, name=f"lanekeeper-stage{stage}-{role}", args=(
            stage, leader, profile, queues, os.getpid(), faults, (dict(os.environ), os.getcwd()))))
        procs[-1].start()
    return procs
