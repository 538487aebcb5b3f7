"""What both stage loops share: device and threads, draining the inbox, owner-death checks."""
from __future__ import annotations

import os
import queue
import signal
import sys
import threading
import time
import traceback
from contextlib import contextmanager

import torch

from engine.stage.messages import Beat, Fatal, StageError
from engine.process.owner import Owner
from engine.process.queues import close_queues


def device_for(profile, stage_cfg) -> torch.device:
    if (profile.runs_on or profile.platform) == "cuda":
        return torch.device(f"cuda:{stage_cfg.devices.split(',')[0]}")
    return torch.device("cpu")


def setup_torch() -> None:
    """Half the cores per stage (two stages share the machine); exact fp32 on CUDA.

    TF32 is off so that float32 results on CUDA match the CPU reference closely.
    """
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def drain(inbox, block: bool, owner: Owner, timeout: float = 0.25) -> list:
    """Everything waiting in the inbox; when idle, block a little.  Exits if the engine's process is gone."""
    items = []
    while True:
        try:
            items.append(inbox.get(block=block and not items, timeout=timeout))
        except queue.Empty:
            if block and not items and owner.gone():
                raise SystemExit(0)   # orphaned while idle: exit handlers still run (vLLM's shutdown)
            return items


class Heart(threading.Thread):
    """Heartbeats from a thread of their own, carrying the stage's progress counters.

    A stage whose loop is stuck (a hung kernel, an injected stall) keeps beating, so the
    watchdog can tell "alive but not progressing" from "gone quiet".

    It also watches the owner: a stage whose owner died (SIGKILL included) ends within one
    beat, mid-request or not, and without waiting on a queue nobody reads any more.
    """

    def __init__(self, out_q, stage_id: int, interval: float, stats, owner: Owner):
        super().__init__(name=f"stage{stage_id}-heartbeat", daemon=True)
        self.out_q, self.stage_id, self.interval, self.stats = out_q, stage_id, interval, stats
        self.owner = owner

    def run(self) -> None:
        while True:
            if self.owner.gone():
                # Orphaned mid-work: end the engine's whole process group (both stages, and vLLM's engine
                # core and workers under stage 0), the way its owner would have, at once.
                os.killpg(os.getpgrp(), signal.SIGKILL)
                os._exit(0)
            try:
                self.out_q.put(Beat(self.stage_id, self.stats()))
            except Exception:   # a queue torn down at exit, or a stats read racing the loop
                pass
            time.sleep(self.interval)


class Clock:
    """Seconds a stage has spent in each part of its loop since it started.  Heartbeats carry them and
    the server's /metrics shows them, so a slow stream can be traced to the part that is slow."""

    def __init__(self, *parts: str):
        self.seconds = dict.fromkeys(parts, 0.0)
        self._open: list[list] = []   # the parts entered and not left: [name, since], innermost last

    @contextmanager
    def part(self, name: str):
        """Time in a part entered inside another is the inner part's alone, so the parts add up to the
        loop's time (stage 1's read-back inside its decode)."""
        now = time.perf_counter()
        if self._open:
            outer = self._open[-1]
            self.seconds[outer[0]] += now - outer[1]
        self._open.append([name, now])
        try:
            yield
        finally:
            now = time.perf_counter()
            _, since = self._open.pop()
            self.seconds[name] += now - since
            if self._open:
                self._open[-1][1] = now


def stall_forever() -> None:
    """An injected stall: the loop stops, the heartbeat thread goes on."""
    while True:
        time.sleep(1)


def _summary() -> str:
    etype, value, _ = sys.exc_info()
    return " ".join("".join(traceback.format_exception_only(etype, value)).split())


def fatal(out_q, stage_id: int, summary: str | None = None) -> None:
    """Report the exception being handled: its traceback, and a one-line summary for error messages.
    The stage exits next, and a stage's queues do not wait for their feeder at exit: flush it here."""
    out_q.put(Fatal(stage_id, summary or _summary(), traceback.format_exc()))
    close_queues(out_q)


def request_crashed(out_q, stage_id: int, request_ids) -> None:
    """The exception being handled fails these requests only; the stage goes on with the rest.

    One request that trips a bug must not cost every other request a dead stage and a restart.
    """
    tb, summary = traceback.format_exc(), _summary()
    for rid in request_ids:
        out_q.put(StageError(rid, stage_id, summary, tb))
