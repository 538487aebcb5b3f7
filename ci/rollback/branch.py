"""Making a rollback (ci/rollback/rules.py decides whether to): the branch `rollback/<culprit>` with the
restored defaults and regenerated pins, verified in a separate worktree before it is kept; a second
lane's red as an evidence commit on it; and the audit log every decision is appended to."""
from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from ci.git import git, identity
from ci.lanes.schema import Lane
from ci.rollback.repo import EVIDENCE, PINS, PROFILES, REVIEW, TRAILER, RollbackError, chain_files, undo
from ci.rollback.decision import Decision
from engine.profile.document import MISSING, ProfileDoc


class VerifyFailed(Exception):
    pass


def restore(repo: Path, worktree: Path, culprit: str, file: str, keys: set[str]) -> list[str]:
    """Undo the culprit's edits of `keys` in the worktree's `file`, comments and all else kept."""
    doc = ProfileDoc.load(worktree / file)
    done = undo(repo, culprit, file, keys, doc)
    if done:
        doc.save()
    return done


# ------------------------------------------------------------------ audit

class Audit:
    """The decisions, as JSON lines in `audit.jsonl` on the ref refs/lanekeeper/audit.

    A ref rather than a file under .git/, so that it travels: with a remote it is fetched before it is
    read and pushed after each entry, and every CI run (each on a fresh checkout) sees the same log and
    the same once-a-day cap.  A push that loses a race with another job's is fetched and retried."""

    REF = "refs/lanekeeper/audit"
    FILE = "audit.jsonl"

    def __init__(self, repo: Path, remote: str | None = None):
        self.repo, self.remote = repo, remote
        self._fetched = False

    def _fetch(self) -> None:
        if self.remote and git(self.repo, "ls-remote", self.remote, self.REF).strip():
            git(self.repo, "fetch", "-q", self.remote, f"+{self.REF}:{self.REF}")
        self._fetched = True

    def _text(self) -> str:
        return git(self.repo, "show", f"{self.REF}:{self.FILE}", check=False)

    def entries(self) -> list[dict]:
        if not self._fetched:
            self._fetch()
        return [json.loads(line) for line in self._text().splitlines() if line.strip()]

    def append(self, entry: dict) -> None:
        entry = {"at": dt.datetime.now(dt.timezone.utc).isoformat(), **entry}
        for _ in range(5):
            self._fetch()
            parent = git(self.repo, "rev-parse", "--verify", "--quiet", self.REF, check=False).strip()
            blob = git(self.repo, "hash-object", "-w", "--stdin",
                       input=self._text() + json.dumps(entry, default=str) + "\n").strip()
            tree = git(self.repo, "mktree", input=f"100644 blob {blob}\t{self.FILE}\n").strip()
            commit = git(self.repo, "commit-tree", tree, *(["-p", parent] if parent else []),
                         "-m", f"rollback audit: {entry.get('action')} {entry.get('lane')}",
                         env=identity(self.repo)).strip()
            git(self.repo, "update-ref", self.REF, commit, *([parent] if parent else []))
            if not self.remote:
                return
            if subprocess.run(["git", "push", "-q", self.remote, f"{self.REF}:{self.REF}"], cwd=self.repo,
                              capture_output=True).returncode == 0:
                return
        raise RollbackError(f"could not push {self.REF} to {self.remote} after 5 tries")

    def recent_apply(self, lane_key: str, hours: float = 24) -> bool:
        cutoff = dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=hours)
        return any(e.get("lane") == lane_key and e.get("action") == "applied"
                   and dt.datetime.fromisoformat(e["at"]) > cutoff for e in self.entries())


# ------------------------------------------------------------------ apply

def verify_failure(worktree: Path, junit_file: Path, output: str) -> str:
    """What a release engineer needs from a failed verification: the failing tests and the pins drift."""
    from ci.run import junit
    from engine.profile import pins

    try:
        failing = junit.failed_ids(junit.parse(junit_file), worktree)
    except junit.JunitError:
        failing = []
    lines = ["failing tests:"] + ([f"  {t}" for t in failing] or
                                 ["  (no JUnit record; the run's last lines:)"] +
                                 [f"  {l}" for l in output.strip().splitlines()[-15:]])
    try:
        drift = pins.drift(worktree / PROFILES)
    except Exception as e:   # a profile that no longer resolves is itself the finding
        drift = [f"the profiles do not resolve: {e}"]
    lines.append(f"resolved vs pinned ({PINS}):")
    lines += [f"  {l}" for l in drift] or ["  none: the pins match the profiles"]
    return "\n".join(lines)


def _verify(wt: Path, lane: Lane, verify: str, tmp: Path) -> str:
    if verify == "none":
        return "not verified (--verify none)"
    if verify == "config":
        report = tmp / "verify-junit.xml"
        cmd = [sys.executable, "-m", "pytest", "tests/config", "-q", "-p", "no:cacheprovider", "--junitxml", str(report)]
    else:
        art = tmp / "artifacts"
        report = art / "junit.xml"
        cmd = [sys.executable, "-m", "ci.cli", "run", lane.key, "--artifacts", str(art)]
    run = subprocess.run(cmd, cwd=wt, capture_output=True, text=True)
    if run.returncode != 0:
        raise VerifyFailed(f"verification ({verify}) failed on the rollback commit\n"
                           f"{verify_failure(wt, report, run.stdout + run.stderr)}")
    return f"verified with {verify}: {(run.stdout.strip().splitlines() or [''])[-1]}"


def apply(d: Decision, lane: Lane, repo: Path, verify: str) -> tuple[str, str, list[str], str]:
    """Branch, commit and verify in a separate worktree.  Returns (branch, sha, restored, verify note)."""
    from engine.profile import pins
    from engine.profile.resolve import resolve

    keys = set(d.keys)
    with tempfile.TemporaryDirectory(prefix="lanekeeper-rollback-") as tmp:
        wt = Path(tmp) / "wt"
        git(repo, "worktree", "add", "-q", "-b", d.branch, str(wt), "HEAD")
        made = False
        try:
            before = pins.compute(wt / PROFILES)
            restored = []
            for file in chain_files(wt, lane.profile):
                restored += restore(repo, wt, d.culprit, file, keys)
            if not restored:
                raise RollbackError("nothing to restore: the culprit's edits to the profile could not be located")
            now = resolve(wt / PROFILES / f"{lane.profile}.yaml", platform=lane.platform or "cpu").flat()
            wrong = {k: (now.get(k, MISSING), old) for k, (old, _) in d.keys.items() if now.get(k, MISSING) != old}
            if wrong:
                raise RollbackError("restoring the culprit's edits did not restore the defaults (changed again "
                                    "since?): " + ", ".join(f"{k} resolves to {a!r}, expected {b!r}"
                                                            for k, (a, b) in wrong.items()))
            after = pins.compute(wt / PROFILES)
            repinned = pins.write(wt / PROFILES, [n for n in after if after[n] != before.get(n)])
            restored += [f"{PINS}: regenerated for {n}" for n in repinned]
            git(wt, "add", "-A", PROFILES)
            git(wt, "commit", "-q", "-m", commit_message(d, lane, repo, restored), env=identity(repo))
            sha = git(wt, "rev-parse", "HEAD").strip()
            note = _verify(wt, lane, verify, Path(tmp))
            made = True
        finally:
            git(repo, "worktree", "remove", "--force", str(wt), check=False)
            if not made:
                git(repo, "branch", "-D", d.branch, check=False)
    return d.branch, sha, restored, note


def add_evidence(d: Decision, lane: Lane, repo: Path) -> str | None:
    """Record this lane's red on the existing rollback branch (an empty commit); None when the
    rollback lives only as a pull request whose branch is not reachable from here."""
    if not d.existing:
        return None
    with tempfile.TemporaryDirectory(prefix="lanekeeper-rollback-") as tmp:
        wt = Path(tmp) / "wt"
        if d.existing == f"refs/heads/{d.branch}":
            git(repo, "worktree", "add", "-q", str(wt), d.branch)
        else:
            git(repo, "worktree", "add", "-q", "-B", d.branch, str(wt), d.existing)
        try:
            git(wt, "commit", "-q", "--allow-empty", "-m", evidence_message(d, lane, repo), env=identity(repo))
            return git(wt, "rev-parse", "HEAD").strip()
        finally:
            git(repo, "worktree", "remove", "--force", str(wt), check=False)


def _trailers(d: Decision, lane: Lane) -> list[str]:
    return [f"{TRAILER}: {d.culprit}", f"{EVIDENCE}: {lane.key}"]


def evidence_message(d: Decision, lane: Lane, repo: Path) -> str:
    subject = git(repo, "log", "-1", "--format=%s", d.culprit).strip()
    lines = [f"Rollback evidence: lane {lane.key} is red too after {d.culprit[:12]}", "",
             f"Lane {lane.label!r} ({lane.key}) went red after {d.culprit[:12]} ({subject!r}).", ""]
    lines += [f"- {e}" for e in d.evidence]
    return "\n".join(lines + [""] + _trailers(d, lane)) + "\n"


def commit_message(d: Decision, lane: Lane, repo: Path, restored: list[str]) -> str:
    subject = git(repo, "log", "-1", "--format=%s", d.culprit).strip()
    flips = ", ".join(f"{k} {b!r} -> {a!r}" for k, (a, b) in sorted(d.keys.items()))
    lines = [f"Roll back {lane.profile} default: {flips}", "",
             f"Lane {lane.label!r} ({lane.key}) went red after {d.culprit[:12]} ({subject!r}).", ""]
    lines += [f"- {e}" for e in d.evidence]
    lines += ["", "Restored:"] + [f"- {r}" for r in restored]
    if d.others:
        lines += ["", REVIEW] + [f"- {f}" for f in d.others]
    lines += ["", "Opt-in profiles keep their own explicit values.", ""] + _trailers(d, lane)
    return "\n".join(lines) + "\n"
