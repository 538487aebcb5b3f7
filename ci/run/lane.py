"""`lanekeeper run` and `lanekeeper repro`: a lane's pytest command, run as CI runs it.

The lane's pytest runs in its own process group.  SIGTERM or SIGINT (a CI agent giving up,
or ^C) is passed on to that group, which then still writes its JUnit file and reports, and
the lane exits with pytest's own status, not a bare signal death.
"""
from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from ci.lanes.schema import Lane, shard_dir, shell
from ci.run import record
from engine.profile.location import require_checkout
from engine.process.tree import kill_tree


def run(lane: Lane, artifacts: str | None, platform: str | None = None, dry_run: bool = False,
        shard: tuple[int, int] | None = None, extra: list[str] = ()) -> int:
    """Run the lane's pytest in the checkout, into `artifacts` (default: the checkout's artifacts/KEY,
    with a shard's own directory below it), emptied of an earlier run's files first."""
    root = require_checkout("lanekeeper run")
    directory = Path(artifacts).resolve() if artifacts else root / "artifacts" / lane.key
    if shard is not None:   # each shard's JUnit and reports apart; `report --junit artifacts/KEY` merges them
        directory = directory / shard_dir(shard)
    cmd = lane.command(str(directory), platform, shard) + list(extra)
    env_text = " ".join(f"{k}={v}" for k, v in sorted(lane.env.items()))
    if dry_run:
        print(f"# in {root}\n{env_text + ' ' if env_text else ''}{shell(cmd)}")
        return 0
    cleared = record.clean(directory, whole=shard is None)
    directory.mkdir(parents=True, exist_ok=True)
    run_id = record.new_run_id()
    print(f"lanekeeper: running lane {lane.key} ({lane.label}) in {root}, run {run_id}, into {directory}"
          + (f" (cleared {len(cleared)} file(s) of an earlier run)" if cleared else "")
          + f"\n  {shell(cmd)}", flush=True)
    proc = subprocess.Popen(cmd, cwd=root, env={**os.environ, **lane.env, record.RUN_ID_ENV: run_id},
                            start_new_session=True)

    def forward(signum, _frame):
        try:
            os.killpg(proc.pid, signum)
        except ProcessLookupError:
            pass

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        try:
            return proc.wait(timeout=lane.budget + 120)
        except subprocess.TimeoutExpired:   # the lane budget should have ended it long ago
            kill_tree([proc.pid], group=proc.pid)
            return 124
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        kill_tree([], group=proc.pid)   # nothing of the lane outlives it
