"""`lanekeeper rollback`: roll a profile default back when a merge-only lane turned red.

This module is what the decision (`rules.py`) and the branch (`branch.py`) read and edit in the
repository: profiles as a commit had them, the culprit's files, the rollback's trailers.

It acts only on a confirmed red that one commit explains: a red streak on at least
`min_red` distinct commits after the last green, still red now, with no flaky commit (a
pass and a fail on the same commit), and exactly one commit in (last green, first red]
that changed a value the lane's profile resolves to, or, with isolation (isolate.py), exactly one
candidate, a key or a commit, whose reversal alone turns the lane's failing tests green.  Infrastructure results (a lost
agent, a cancelled job) are set aside: they neither count as red nor break a streak.

What a rollback changes, on a branch `rollback/<culprit>` made in a separate worktree
(the caller's checkout is never touched):
- in the files the lane's profile resolves from (its `base_config` chain), each key whose
  resolved default the culprit changed goes back to the culprit's parent value (all of
  them, or those `--keys` names), by path, with every comment kept;
- profiles/pins.yaml is regenerated for every profile whose resolved values that changes,
  opt-in profiles that inherit the key included;
- nothing else: the culprit's docs, tests and other profiles' explicit values stay, and the
  commit message and pull request list them for review.

One culprit gets one rollback whatever the lanes: a second red lane adds its evidence to
the existing branch (local, on the remote, or an open pull request's) instead of making
another.  Every decision, acting or not, is appended to an audit log (JSON lines) kept on the ref
refs/lanekeeper/audit, pushed with the branch so that every CI run sees it.
"""
from __future__ import annotations

import io
import subprocess
import tarfile
import tempfile
from pathlib import Path

from ci.git import git
from ci.rollback.history import Build
from ci.lanes.schema import Lane
from engine.errors import UserError
from engine.profile.document import MISSING, ProfileDoc, diff, platform_key

PROFILES = "profiles"
PINS = "profiles/pins.yaml"
TRAILER = "Rollback-Of"
EVIDENCE = "Rollback-Evidence"       # trailer naming the lane whose red a commit records
REVIEW = "Also changed by the culprit, not restored; review:"


class RollbackError(UserError):
    """Bad input or state: a missing repository or commit, a dirty work tree."""


def check_commits(repo: Path, builds: list[Build]) -> None:
    """Every commit the decision reads must be in the repository, or the answer would be a guess."""
    shallow = git(repo, "rev-parse", "--is-shallow-repository", check=False).strip() == "true"
    for b in builds:
        if subprocess.run(["git", "cat-file", "-e", f"{b.commit}^{{commit}}"], cwd=repo,
                          capture_output=True).returncode != 0:
            hint = ("--repo is a shallow clone: run git fetch --unshallow" if shallow else
                    "a shallow clone? try git fetch --unshallow, or git fetch the branch the build ran")
            raise RollbackError(f"build #{b.number}'s commit {b.commit[:12]} is not in --repo {repo}; {hint}")


def resolved_at(repo: Path, commit: str, lane: Lane) -> dict:
    """The lane's profile, resolved at a commit (profiles/ as that commit had it)."""
    from engine.profile.resolve import ProfileError, resolve

    data = subprocess.run(["git", "archive", "--format=tar", commit, PROFILES], cwd=repo, capture_output=True)
    if data.returncode != 0:
        return {}
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(fileobj=io.BytesIO(data.stdout)) as tar:
            tar.extractall(tmp, filter="data")
        path = Path(tmp) / PROFILES / f"{lane.profile}.yaml"
        if not path.exists():
            return {}
        try:
            return resolve(path, platform=lane.platform or "cpu").flat()
        except ProfileError as e:
            return {"<invalid>": str(e)}


def chain_files(root: Path, profile: str) -> list[str]:
    """The lane profile's base_config chain under `root`, as repository paths, base first."""
    from engine.profile.resolve import ProfileError, layer_files

    path = root / PROFILES / f"{profile}.yaml"
    try:
        return [str(p.relative_to(root.resolve())) for p in layer_files(path)] if path.exists() else []
    except ProfileError:
        return [f"{PROFILES}/{profile}.yaml"]


def branch_name(repo: Path, commit: str) -> str:
    """One branch per culprit, whichever lane finds it first."""
    return f"rollback/{git(repo, 'rev-parse', '--short=10', commit).strip()}"


def recorded(repo: Path, ref: str, culprit: str, lane: Lane) -> bool:
    """Whether a commit on `ref` already records this lane's red for this culprit."""
    messages = git(repo, "log", "--format=%B%x00", ref, check=False).split("\0")
    return any(f"{TRAILER}: {culprit}" in m and f"{EVIDENCE}: {lane.key}" in m for m in messages)


# ------------------------------------------------------------------ edits

def undo(repo: Path, culprit: str, file: str, keys: set[str], doc: ProfileDoc) -> list[str]:
    """Set each path of `doc` that the culprit changed in `file`, and that sets one of `keys`, back
    to its value before the culprit; returns what it did."""
    show = lambda rev: git(repo, "show", f"{rev}:{file}", check=False)
    before = ProfileDoc.load(file, show(f"{culprit}^") or "{}").flat()
    after = ProfileDoc.load(file, show(culprit) or "{}").flat()
    done = []
    for path, (old, new) in diff(before, after).items():
        if platform_key(path) not in keys:
            continue
        if old is MISSING:
            doc.delete(path)
        else:
            doc.set(path, old)
        done.append(f"{file}: {path}: {new!r} -> {old!r}")
    return done


def left_over(repo: Path, culprit: str, file: str, keys: set[str]) -> bool:
    """Whether the culprit changed more in `file` than the keys a rollback restores (a comment, another key)."""
    doc = ProfileDoc.load(file, git(repo, "show", f"{culprit}:{file}", check=False) or "{}")
    undo(repo, culprit, file, keys, doc)
    return doc.dump() != git(repo, "show", f"{culprit}^:{file}", check=False)


