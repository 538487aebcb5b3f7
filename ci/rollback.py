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

import io
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ci.git import existing_ref, git
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


# ------------------------------------------------------------------ decision

def _infra_note(infra: list[Build]) -> str:
    return (f"{len(infra)} build(s) set aside as infrastructure (lost agent / cancelled): "
            f"{', '.join(f'#{b.number}' for b in infra)}")


def decide(builds: list[Build], lane: Lane, repo: Path, min_red: int = 2, audit=None,
           keys: list[str] | None = None, remote: str | None = None,
           pr_for: Callable[[str], dict | None] | None = None) -> Decision:
    """What to do about the lane's history: nothing (and why), a rollback, or evidence on an existing one.
    `audit` (ci.rollback_branch.Audit) caps rollbacks at one a lane a day; `pr_for(branch)` finds a
    branch's open pull request."""
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


def _left_over(repo: Path, culprit: str, file: str, keys: set[str]) -> bool:
    """Whether the culprit changed more in `file` than the keys a rollback restores (a comment, another key)."""
    doc = ProfileDoc.load(file, git(repo, "show", f"{culprit}:{file}", check=False) or "{}")
    undo(repo, culprit, file, keys, doc)
    return doc.dump() != git(repo, "show", f"{culprit}^:{file}", check=False)


