"""A stage's view of the engine that owns it: its process group and whether its owner is still there."""
from __future__ import annotations

import os
import time

from engine.process.tree import ended


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
        return self.proc is None or ended(self.proc)
