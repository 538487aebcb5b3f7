"""`lanekeeper rollback`: roll a profile default back when a merge-only lane turned red.

It acts only on a confirmed red that one commit explains: a red streak on at least
`min_red` distinct commits after the last green, still red now, with no flaky commit (a
pass and a fail on the same commit), and exactly one commit in (last green, first red]
that changed a value the lane's profile resolves to.  Infrastructure results (a lost
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

import datetime as dt
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ci.history import Build
from ci.lanes import Lane
from engine.errors import UserError
from engine.profile_doc import MISSING, ProfileDoc, diff, platform_key

PROFILES = "profiles"
PINS = "profiles/pins.yaml"
TRAILER = "Rollback-Of"
EVIDENCE = "Rollback-Evidence"       # trailer naming the lane whose red a commit records
REVIEW = "Also changed by the culprit, not restored; review:"


class RollbackError(UserError):
    """Bad input or state: a missing repository or commit, a dirty work tree."""


class VerifyFailed(Exception):
    pass


@dataclass
class Decision:
    action: str                     # none | rollback | evidence (add this lane's red to an existing rollback)
    reason: str
    evidence: list[str] = field(default_factory=list)
    culprit: str | None = None
    keys: dict[str, tuple] = field(default_factory=dict)   # resolved key -> (parent value, culprit value)
    last_green: Build | None = None
    reds: list[Build] = field(default_factory=list)
    others: list[str] = field(default_factory=list)        # the culprit's files a rollback leaves as they are
    branch: str | None = None
    existing: str | None = None     # the ref that holds the existing rollback of this culprit, if any
    pr: dict | None = None          # its open pull request, if any

    @property
    def act(self) -> bool:
        return self.action != "none"


# ------------------------------------------------------------------ git

def git(repo: Path, *args: str, check: bool = True, env: dict | None = None, input: str | None = None) -> str:
    run = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, input=input,
                         env={**os.environ, **(env or {})})
    if check and run.returncode != 0:
        raise RollbackError(f"git {' '.join(args)} failed: {run.stderr.strip()}")
    return run.stdout


def check_repo(repo: Path) -> None:
    if not repo.is_dir():
        raise RollbackError(f"repository not found: {repo}")
    if subprocess.run(["git", "rev-parse", "--git-dir"], cwd=repo, capture_output=True).returncode != 0:
        raise RollbackError(f"not a git repository: {repo}")
    dirty = git(repo, "status", "--porcelain", "--untracked-files=no").strip()
    if dirty:
        raise RollbackError(f"the work tree of {repo} has uncommitted changes; commit or stash them first:\n{dirty}")


def _check_commits(repo: Path, builds: list[Build]) -> None:
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
    from engine.config import ProfileError, resolve

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
    from engine.config import ProfileError, layer_files

    path = root / PROFILES / f"{profile}.yaml"
    try:
        return [str(p.relative_to(root.resolve())) for p in layer_files(path)] if path.exists() else []
    except ProfileError:
        return [f"{PROFILES}/{profile}.yaml"]


def branch_name(repo: Path, commit: str) -> str:
    """One branch per culprit, whichever lane finds it first."""
    return f"rollback/{git(repo, 'rev-parse', '--short=10', commit).strip()}"


def _recorded(repo: Path, ref: str, culprit: str, lane: Lane) -> bool:
    """Whether a commit on `ref` already records this lane's red for this culprit."""
    messages = git(repo, "log", "--format=%B%x00", ref, check=False).split("\0")
    return any(f"{TRAILER}: {culprit}" in m and f"{EVIDENCE}: {lane.key}" in m for m in messages)


def remote_ref(repo: Path, branch: str, remote: str | None) -> str | None:
    """The remote's copy of a branch, fetched, or None when the remote has no such branch."""
    if remote and git(repo, "ls-remote", "--heads", remote, f"refs/heads/{branch}").strip():
        ref = f"refs/remotes/{remote}/{branch}"
        git(repo, "fetch", "-q", remote, f"+refs/heads/{branch}:{ref}")
        return ref
    return None


def existing_ref(repo: Path, branch: str, remote: str | None) -> str | None:
    """The ref holding an existing rollback branch: local, else the remote's."""
    if git(repo, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}", check=False).strip():
        return f"refs/heads/{branch}"
    return remote_ref(repo, branch, remote)


# ------------------------------------------------------------------ decision

def _infra_note(infra: list[Build]) -> str:
    return (f"{len(infra)} build(s) set aside as infrastructure (lost agent / cancelled): "
            f"{', '.join(f'#{b.number}' for b in infra)}")


def decide(builds: list[Build], lane: Lane, repo: Path, min_red: int = 2, audit: "Audit | None" = None,
           keys: list[str] | None = None, remote: str | None = None,
           pr_for: Callable[[str], dict | None] | None = None) -> Decision:
    main = sorted((b for b in builds if b.branch == "main"), key=lambda b: b.number)
    seq = []   # (build, verdict) with infrastructure failures and no-verdicts dropped
    infra: list[Build] = []
    by_commit: dict[str, set] = {}
    for b in main:
        verdict, flipped = b.verdict(lane)   # one result per build, however many shards and attempts
        if verdict in ("green", "red"):
            by_commit.setdefault(b.commit, set()).update({"green", "red"} if flipped else {verdict})
            seq.append((b, verdict))
        elif verdict == "infra":
            infra.append(b)
    if not seq:
        if infra:
            return Decision("none", f"{_infra_note(infra)}, and no other result; nothing red to act on")
        return Decision("none", f"no results for lane {lane.key} on main")
    flaky = [c for c, vs in by_commit.items() if vs == {"green", "red"}]
    if flaky:
        return Decision("none", f"flaky: commit {flaky[0][:12]} has both a pass and a fail for {lane.key}; not acting")
    newest, verdict = seq[-1]
    if verdict == "green":
        later = [b for b in infra if b.number > newest.number]
        if later:
            return Decision("none", f"{_infra_note(later)}; the last real result, build #{newest.number}, is green; "
                                    "nothing red to act on")
        return Decision("none", f"lane {lane.key} is green again at build #{newest.number}; nothing to do")
    greens = [i for i, (_, v) in enumerate(seq) if v == "green"]
    if not greens:
        return Decision("none", f"lane {lane.key} has no green build to compare with")
    last_green = seq[greens[-1]][0]
    reds = [b for b, _ in seq[greens[-1] + 1:]]
    red_commits = list(dict.fromkeys(b.commit for b in reds))
    d = Decision("none", "", last_green=last_green, reds=reds)
    d.evidence = [f"last green: build #{last_green.number} at {last_green.commit[:12]} {last_green.url}".rstrip()]
    d.evidence += [f"red: build #{b.number} at {b.commit[:12]} {b.url}".rstrip() for b in reds]
    aside = [b for b in infra if b.number > last_green.number]
    if aside:
        d.evidence.append(_infra_note(aside))
    if len(red_commits) < min_red:
        d.reason = (f"only {len(red_commits)} red build(s) on distinct commits after the last green "
                    f"(need {min_red}); not confirmed")
        return d
    _check_commits(repo, [last_green, *reds])
    first_red = reds[0]
    commits = git(repo, "rev-list", "--reverse", f"{last_green.commit}..{first_red.commit}").split()
    if not commits:
        d.reason = f"git has no commits between {last_green.commit[:12]} and {first_red.commit[:12]}"
        return d
    candidates = []
    for c in commits:
        changed = diff(resolved_at(repo, f"{c}^", lane), resolved_at(repo, c, lane))
        if changed:
            candidates.append((c, changed))
    d.evidence.append(f"commits in (last green, first red]: {', '.join(c[:12] for c in commits)}")
    if not candidates:
        d.reason = (f"the red streak started at a commit that changed no default of {lane.profile}; "
                    "not a profile default flip, reporting only")
        return d
    if len(candidates) > 1:
        d.reason = f"{len(candidates)} candidate commits changed {lane.profile}: " \
                   f"{', '.join(c[:12] for c, _ in candidates)}; reporting only"
        return d
    culprit, changed = candidates[0]
    d.culprit = culprit
    message = git(repo, "log", "-1", "--format=%B", culprit)
    subject = message.splitlines()[0] if message else ""
    d.evidence.append(f"culprit: {culprit[:12]} {subject!r} changed " +
                      ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in sorted(changed.items())))
    unknown = sorted(set(keys or ()) - set(changed))
    if unknown:
        d.reason = (f"--keys {', '.join(unknown)}: not a default the culprit changed "
                    f"(it changed {', '.join(sorted(changed))}); not acting")
        return d
    d.keys = {k: v for k, v in changed.items() if not keys or k in keys}
    touched = git(repo, "diff-tree", "--no-commit-id", "--name-only", "-r", "--no-renames", culprit).split()
    chain = set(chain_files(repo, lane.profile))
    d.others = [t for t in touched if t != PINS and (t not in chain or _left_over(repo, culprit, t, set(d.keys)))]
    d.branch = branch_name(repo, culprit)
    if "<invalid>" in d.keys:
        d.reason = "the profile did not resolve on one side of the culprit; reporting only"
        return d
    if "NOAUTOREVERT" in message:
        d.reason = f"culprit {culprit[:12]} says NOAUTOREVERT; not acting"
        return d
    if f"{TRAILER}:" in message or subject.startswith(("Revert", "Roll back", "Rollback")) \
            or "This reverts commit" in message:
        d.reason = f"culprit {culprit[:12]} is itself a rollback or revert; never rolling back a rollback"
        return d
    head = resolved_at(repo, "HEAD", lane)
    if all(head.get(k, MISSING) == before for k, (before, _) in d.keys.items()):
        d.reason = f"the default is already restored on main ({', '.join(f'{k}={a!r}' for k, (a, _) in d.keys.items())})"
        return d
    d.existing = existing_ref(repo, d.branch, remote)
    d.pr = pr_for(d.branch) if pr_for else None
    if d.existing or d.pr:
        where = f"branch {d.branch}" + (f" (pull request {d.pr.get('html_url')})" if d.pr else "")
        if d.existing and _recorded(repo, d.existing, culprit, lane):
            d.reason = f"a rollback of {culprit[:12]} already exists on {where} and records lane {lane.key}'s red"
        else:
            d.action = "evidence"
            d.reason = f"a rollback of {culprit[:12]} already exists on {where}; adding lane {lane.key}'s red to it"
        return d
    if audit is not None and audit.recent_apply(lane.key):
        d.reason = f"lane {lane.key} already had a rollback in the last 24 h; at most one a day"
        return d
    d.action, d.reason = "rollback", f"confirmed: {culprit[:12]} flipped {', '.join(sorted(d.keys))} of {lane.profile}"
    return d


# ------------------------------------------------------------------ edits

def _undo(repo: Path, culprit: str, file: str, keys: set[str], doc: ProfileDoc) -> list[str]:
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


def _left_over(repo: Path, culprit: str, file: str, keys: set[str]) -> bool:
    """Whether the culprit changed more in `file` than the keys a rollback restores (a comment, another key)."""
    doc = ProfileDoc.load(file, git(repo, "show", f"{culprit}:{file}", check=False) or "{}")
    _undo(repo, culprit, file, keys, doc)
    return doc.dump() != git(repo, "show", f"{culprit}^:{file}", check=False)


def restore(repo: Path, worktree: Path, culprit: str, file: str, keys: set[str]) -> list[str]:
    """Undo the culprit's edits of `keys` in the worktree's `file`, comments and all else kept."""
    doc = ProfileDoc.load(worktree / file)
    done = _undo(repo, culprit, file, keys, doc)
    if done:
        doc.save()
    return done


def _identity(repo: Path) -> dict:
    if git(repo, "config", "user.name", check=False).strip() and git(repo, "config", "user.email", check=False).strip():
        return {}
    return {f"GIT_{who}_{what}": value for who in ("AUTHOR", "COMMITTER")
            for what, value in (("NAME", "lanekeeper"), ("EMAIL", "lanekeeper@localhost"))}


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
                         env=_identity(self.repo)).strip()
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
    from ci import junit
    from engine import pins

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
    from engine import pins
    from engine.config import resolve

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
            git(wt, "commit", "-q", "-m", commit_message(d, lane, repo, restored), env=_identity(repo))
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
            git(wt, "commit", "-q", "--allow-empty", "-m", evidence_message(d, lane, repo), env=_identity(repo))
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
