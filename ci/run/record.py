"""One run's record, `run.json` beside its JUnit file, and the files a run writes into its artifacts.

The JUnit file says what each test did; the record says which run that was (an id the shards of one CI
build share), which lane and shard, and whether the lane budget cut it short.  `lanekeeper report`
reads it beside each JUnit file, so that it renders what the run's own summary rendered, and so that
it refuses to merge results of one lane from different runs (an old unsharded file beside this
build's shards, a shard copied in from another build).
"""
from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from engine.errors import UserError

RECORD_FILE = "run.json"
RUN_ID_ENV = "LANEKEEPER_RUN_ID"
# Every file a run writes into its artifacts directory; `lanekeeper run` removes these, and only these,
# before it starts, so that the directory describes that run alone.
ARTIFACT_FILES = ("junit.xml", RECORD_FILE, "matrix-summary.md", "stall-report.md", "stall-report.json")


class RecordError(UserError):
    pass


class RunRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    run_id: str
    lane: str | None = None
    shard: str | None = None          # "K/N"
    budget_hit: bool = False
    budget: float | None = None       # seconds


def new_run_id(env=os.environ) -> str:
    """The id this run shares with the other shards of its build: the CI's build id, or
    LANEKEEPER_RUN_ID, else a fresh one (a local run is a run of its own)."""
    if env.get(RUN_ID_ENV):
        return env[RUN_ID_ENV]
    if env.get("BUILDKITE_BUILD_ID"):
        return f"buildkite-{env['BUILDKITE_BUILD_ID']}"
    if env.get("GITHUB_RUN_ID"):   # a re-run of failed jobs keeps the run id; its shards still belong together
        return f"github-{env['GITHUB_RUN_ID']}"
    return f"local-{uuid.uuid4().hex[:12]}"


def write(directory: Path, record: RunRecord) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / RECORD_FILE).write_text(record.model_dump_json(indent=2) + "\n")


def read(junit_path: str | Path) -> RunRecord | None:
    """The record beside a JUnit file, or None (a JUnit file from plain pytest has none)."""
    path = Path(junit_path).parent / RECORD_FILE
    if not path.is_file():
        return None
    try:
        return RunRecord.model_validate_json(path.read_text())
    except ValidationError as e:
        err = e.errors()[0]
        raise RecordError(f"{path}: not a run record ({'.'.join(map(str, err['loc'])) or 'file'}: {err['msg']})") \
            from None


def check_one_run(records: dict[str, RunRecord | None]) -> None:
    """Refuse JUnit files (path -> record) of one lane that are not of one run."""
    by_lane: dict[str, list[tuple[str, RunRecord]]] = {}
    for path, record in records.items():
        if record is not None:
            by_lane.setdefault(record.lane or "", []).append((path, record))
    for lane, files in by_lane.items():
        (first, a), *rest = files
        shards: dict[str | None, str] = {a.shard: first}
        for path, b in rest:
            clash = ("are from different runs" if b.run_id != a.run_id else
                     "mix a whole run with a shard" if (a.shard is None) != (b.shard is None) else
                     "split the lane differently" if a.shard and b.shard.split("/")[1] != a.shard.split("/")[1] else
                     "are the same shard" if b.shard in shards else None)
            if clash:
                other = shards.get(b.shard, first)
                raise RecordError(f"{other} and {path}: lane {lane or '?'}'s results {clash} (run ids {a.run_id}, "
                                  f"{b.run_id}); report them apart, or re-run the lane into an empty directory")
            shards[b.shard] = path


def clean(directory: Path, whole: bool) -> list[Path]:
    """Remove what an earlier run left in `directory`: its files, and, for a whole (unsharded) run, its
    shards' directories; a shard's run also removes the whole run's files one level up, which
    `report` would otherwise merge with it.  Anything else in the directory stays."""
    if directory.exists() and not directory.is_dir():
        raise RecordError(f"--artifacts {directory}: a file, not a directory")
    removed = [p for p in (directory / name for name in ARTIFACT_FILES) if p.is_file()]
    if whole:
        removed += [d for d in directory.glob("shard-*-of-*") if d.is_dir()]
    else:
        removed += [p for p in (directory.parent / name for name in ARTIFACT_FILES) if p.is_file()]
    for path in removed:
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    return removed
