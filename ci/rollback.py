"""`lanekeeper rollback`: roll a profile default back when a merge-only lane turned red.

It acts only on a confirmed red that one commit explains: a red streak on at least
`min_red` distinct commits after the last green, still red now, with no flaky commit
(a pass and a fail on the same commit), and exactly one commit in (last green, first
red] that changed a value the lane's profile resolves to, touching nothing but
profiles/.  The rollback restores only those keys, in the profile and in
profiles/pins.yaml (comments kept: ruamel round trip), on a new branch, in a separate
worktree so the caller's checkout is never touched; opt-in profiles stay as they are.

Every decision, acting or not, is appended to an audit log (JSON lines).
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

from ruamel.yaml import YAML

from ci.history import Build
from ci.lanes import Lane

PROFILES = "profiles"
PINS = "profiles/pins.yaml"
TRAILER = "Rollback-Of"


class RollbackError(Exception):
    """Bad input or state: a missing repository, a dirty work tree."""


@dataclass
class Decision:
    act: bool
    reason: str
    evidence: list[str] = field(default_factory=list)
    culprit: str | None = None
    keys: dict[str, tuple] = field(default_factory=dict)   # resolved key -> (parent value, culprit value)
    last_green: Build | None = None
    reds: list[Build] = field(default_factory=list)


# ------------------------------------------------------------------ git

def git(repo: Path, *args: str, check: bool = True, env: dict | None = None) -> str:
    run = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, env={**os.environ, **(env or {})})
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


# ------------------------------------------------------------------ decision

def decide(builds: list[Build], lane: Lane, repo: Path, min_red: int = 2, audit: "Audit | None" = None) -> Decision:
    main = sorted((b for b in builds if b.branch == "main"), key=lambda b: b.number)
    seq = []   # (build, verdict) with infrastructure failures and no-verdicts dropped
    by_commit: dict[str, set] = {}
    for b in main:
        verdicts = [r.verdict for r in b.results(lane)]
        real = [v for v in verdicts if v in ("green", "red")]
        for v in real:
            by_commit.setdefault(b.commit, set()).add(v)
        if real:
            seq.append((b, "red" if real[-1] == "red" else "green"))
    if not seq:
        return Decision(False, f"no results for lane {lane.key} on main")
    flaky = [c for c, vs in by_commit.items() if vs == {"green", "red"}]
    if flaky:
        return Decision(False, f"flaky: commit {flaky[0][:12]} has both a pass and a fail for {lane.key}; not acting")
    newest, verdict = seq[-1]
    if verdict == "green":
        return Decision(False, f"lane {lane.key} is green again at build #{newest.number}; nothing to do")
    greens = [i for i, (_, v) in enumerate(seq) if v == "green"]
    if not greens:
        return Decision(False, f"lane {lane.key} has no green build to compare with")
    last_green = seq[greens[-1]][0]
    reds = [b for b, _ in seq[greens[-1] + 1:]]
    red_commits = list(dict.fromkeys(b.commit for b in reds))
    d = Decision(False, "", last_green=last_green, reds=reds)
    d.evidence = [f"last green: build #{last_green.number} at {last_green.commit[:12]} {last_green.url}".rstrip()]
    d.evidence += [f"red: build #{b.number} at {b.commit[:12]} {b.url}".rstrip() for b in reds]
    if len(red_commits) < min_red:
        d.reason = (f"only {len(red_commits)} red build(s) on distinct commits after the last green "
                    f"(need {min_red}); not confirmed")
        return d
    first_red = reds[0]
    commits = git(repo, "rev-list", "--reverse", f"{last_green.commit}..{first_red.commit}").split()
    if not commits:
        d.reason = f"git has no commits between {last_green.commit[:12]} and {first_red.commit[:12]}"
        return d
    candidates = []
    for c in commits:
        before, after = resolved_at(repo, f"{c}^", lane), resolved_at(repo, c, lane)
        changed = {k: (before.get(k), after.get(k)) for k in set(before) | set(after) if before.get(k) != after.get(k)}
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
    culprit, keys = candidates[0]
    d.culprit, d.keys = culprit, keys
    message = git(repo, "log", "-1", "--format=%B", culprit)
    subject = message.splitlines()[0] if message else ""
    d.evidence.append(f"culprit: {culprit[:12]} {subject!r} changed " +
                      ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in sorted(keys.items())))
    touched = git(repo, "diff-tree", "--no-commit-id", "--name-only", "-r", culprit).split()
    branch = branch_name(lane, repo, culprit)
    if "<invalid>" in keys:
        d.reason = "the profile did not resolve on one side of the culprit; reporting only"
    elif any(not t.startswith(PROFILES + "/") for t in touched):
        d.reason = f"culprit {culprit[:12]} also changed {', '.join(t for t in touched if not t.startswith(PROFILES))}; " \
                   "not a pure default flip, reporting only"
    elif "NOAUTOREVERT" in message:
        d.reason = f"culprit {culprit[:12]} says NOAUTOREVERT; not acting"
    elif f"{TRAILER}:" in message or subject.startswith(("Revert", "Roll back", "Rollback")) \
            or "This reverts commit" in message:
        d.reason = f"culprit {culprit[:12]} is itself a rollback or revert; never rolling back a rollback"
    elif _all_restored(resolved_at(repo, "HEAD", lane), keys):
        d.reason = f"the default is already restored on main ({', '.join(f'{k}={a!r}' for k, (a, _) in keys.items())})"
    elif git(repo, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}", check=False).strip():
        d.reason = f"a rollback of {culprit[:12]} already exists on branch {branch}"
    elif audit is not None and audit.recent_apply(lane.key):
        d.reason = f"lane {lane.key} already had a rollback in the last 24 h; at most one a day"
    else:
        d.act, d.reason = True, f"confirmed: {culprit[:12]} flipped {', '.join(sorted(keys))} of {lane.profile}"
    return d


def _all_restored(head: dict, keys: dict[str, tuple]) -> bool:
    return all(head.get(k) == before for k, (before, _) in keys.items())


def branch_name(lane: Lane, repo: Path, commit: str) -> str:
    return f"rollback/{lane.key}/{git(repo, 'rev-parse', '--short=10', commit).strip()}"


# ------------------------------------------------------------------ YAML edits

def _yaml() -> YAML:
    y = YAML(typ="rt")
    y.indent(mapping=2, sequence=4, offset=2)
    y.preserve_quotes = True
    y.width = 4096
    return y


def _leaves(node, prefix=()) -> dict[tuple, object]:
    out = {}
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "stages" and isinstance(v, list):
                for item in v:
                    out.update(_leaves({kk: vv for kk, vv in item.items() if kk != "stage_id"},
                                       prefix + ("stages", item.get("stage_id"))))
            elif isinstance(v, dict) and v:
                out.update(_leaves(v, prefix + (k,)))
            else:
                out[prefix + (k,)] = v
    return out


def _set(doc, path: tuple, value, delete: bool) -> None:
    node = doc
    for i, part in enumerate(path[:-1]):
        if part == "stages" and i + 1 < len(path) and isinstance(node.get("stages"), list):
            node = next(item for item in node["stages"] if item.get("stage_id") == path[i + 1])
            continue
        if i > 0 and path[i - 1] == "stages":
            continue
        node = node.setdefault(part, {})
    if delete:
        node.pop(path[-1], None)
    else:
        node[path[-1]] = value


def restore(repo: Path, worktree: Path, culprit: str, file: str, wanted) -> list[str]:
    """Set every leaf of `file` that the culprit changed and `wanted(path)` accepts back to its parent value."""
    y = _yaml()
    show = lambda rev: git(repo, "show", f"{rev}:{file}", check=False)
    before, after = _leaves(y.load(show(f"{culprit}^") or "{}") or {}), _leaves(y.load(show(culprit) or "{}") or {})
    target = worktree / file
    doc = y.load(target.read_text())
    done = []
    for path in sorted(set(before) | set(after), key=str):
        if before.get(path) == after.get(path) or not wanted(path):
            continue
        _set(doc, path, before.get(path), delete=path not in before)
        done.append(f"{file}: {'.'.join(map(str, path))}: {after.get(path)!r} -> {before.get(path)!r}")
    if done:
        buf = io.StringIO()
        y.dump(doc, buf)
        target.write_text(buf.getvalue())
    return done


# ------------------------------------------------------------------ audit

class Audit:
    def __init__(self, path: Path):
        self.path = path

    @classmethod
    def for_repo(cls, repo: Path) -> "Audit":
        common = Path(git(repo, "rev-parse", "--git-common-dir").strip())
        return cls((repo / common if not common.is_absolute() else common) / "lanekeeper" / "rollback-audit.jsonl")

    def entries(self) -> list[dict]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

    def append(self, entry: dict) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        entry = {"at": dt.datetime.now(dt.timezone.utc).isoformat(), **entry}
        with self.path.open("a") as f:
            f.write(json.dumps(entry, default=str) + "\n")

    def recent_apply(self, lane_key: str, hours: float = 24) -> bool:
        cutoff = dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=hours)
        return any(e.get("lane") == lane_key and e.get("action") == "applied"
                   and dt.datetime.fromisoformat(e["at"]) > cutoff for e in self.entries())


# ------------------------------------------------------------------ apply

VERIFY = {"config": [sys.executable, "-m", "pytest", "tests/config", "-q", "-p", "no:cacheprovider"]}


def apply(d: Decision, lane: Lane, repo: Path, verify: str) -> tuple[str, str, list[str], str]:
    """Branch, commit and verify in a separate worktree.  Returns (branch, sha, restored, verify note)."""
    branch = branch_name(lane, repo, d.culprit)
    profile_files = {f"{PROFILES}/{lane.profile}.yaml"}
    with tempfile.TemporaryDirectory(prefix="lanekeeper-rollback-") as tmp:
        wt = Path(tmp) / "wt"
        git(repo, "worktree", "add", "-q", "-b", branch, str(wt), "HEAD")
        try:
            keys = set(d.keys)
            touched = git(repo, "diff-tree", "--no-commit-id", "--name-only", "-r", d.culprit).split()
            restored = []
            for file in touched:
                if file in profile_files:
                    restored += restore(repo, wt, d.culprit, file, lambda p: _resolved_key(p) in keys)
                elif file == PINS:
                    restored += restore(repo, wt, d.culprit, file,
                                        lambda p: len(p) == 3 and p[0] == lane.profile and p[2] in keys)
            if not restored:
                raise RollbackError("nothing to restore: the culprit's edits to the profile could not be located")
            git(wt, "add", "-A", PROFILES)
            msg = commit_message(d, lane, repo, restored)
            env = {}
            if not (git(repo, "config", "user.name", check=False).strip()
                    and git(repo, "config", "user.email", check=False).strip()):
                env = {f"GIT_{who}_{what}": value for who in ("AUTHOR", "COMMITTER")
                       for what, value in (("NAME", "lanekeeper"), ("EMAIL", "lanekeeper@localhost"))}
            git(wt, "commit", "-q", "-m", msg, env=env)
            sha = git(wt, "rev-parse", "HEAD").strip()
            note = "not verified (--verify none)"
            if verify != "none":
                cmd = VERIFY.get(verify) or [sys.executable, "-m", "ci.cli", "run", lane.key, "--artifacts",
                                             str(Path(tmp) / "artifacts")]
                run = subprocess.run(cmd, cwd=wt, capture_output=True, text=True)
                tail = (run.stdout.strip().splitlines() or [""])[-1]
                if run.returncode != 0:
                    git(repo, "worktree", "remove", "--force", str(wt))
                    git(repo, "branch", "-D", branch)
                    raise VerifyFailed(f"verification ({verify}) failed on the rollback commit: {tail}\n"
                                       f"{run.stdout[-2000:]}")
                note = f"verified with {verify}: {tail}"
        finally:
            if wt.exists():
                git(repo, "worktree", "remove", "--force", str(wt), check=False)
    return branch, sha, restored, note


class VerifyFailed(Exception):
    pass


def _resolved_key(path: tuple) -> str:
    if len(path) > 2 and path[0] == "platforms":
        path = path[2:]
    return ".".join(map(str, path))


def commit_message(d: Decision, lane: Lane, repo: Path, restored: list[str]) -> str:
    subject = git(repo, "log", "-1", "--format=%s", d.culprit).strip()
    flips = ", ".join(f"{k} {b!r} -> {a!r}" for k, (a, b) in sorted(d.keys.items()))
    lines = [f"Roll back {lane.profile} default: {flips}", "",
             f"Lane {lane.label!r} ({lane.key}) went red after {d.culprit[:12]} ({subject!r}).", ""]
    lines += [f"- {e}" for e in d.evidence]
    lines += ["", "Restored:"] + [f"- {r}" for r in restored]
    lines += ["", "Opt-in profiles are left as they are.", "", f"{TRAILER}: {d.culprit}"]
    return "\n".join(lines) + "\n"
