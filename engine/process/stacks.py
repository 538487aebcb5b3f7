"""Python stacks of engine processes on demand: SIGUSR1 makes faulthandler write every thread's stack,
to a file in the directory the test plugin names (`LANEKEEPER_STACK_DIR`), else to stderr."""
from __future__ import annotations

import faulthandler
import os
import signal
import sys

STACK_DUMP_SIGNAL = signal.SIGUSR1
STACK_DIR_ENV = "LANEKEEPER_STACK_DIR"


def stack_file(stack_dir: str, pid: int) -> str:
    return os.path.join(stack_dir, f"stacks-{pid}.txt")


def dump_stacks_on_signal() -> None:
    """Register the stack dump for this process (a stage or the speech server)."""
    stack_dir = os.environ.get(STACK_DIR_ENV)
    out = open(stack_file(stack_dir, os.getpid()), "w") if stack_dir and os.path.isdir(stack_dir) else sys.stderr
    faulthandler.register(STACK_DUMP_SIGNAL, file=out, all_threads=True)
