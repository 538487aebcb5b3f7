"""git, as rollback drives it: a command that must succeed, a repository fit to work in, the refs a
rollback branch may already have, and an identity for commits made in CI."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

from engine.errors import UserError


class GitError(UserError):
    """A repository that is missing, dirty, or refused a command."""


def git(repo: Path, *args: str, check: bool = True, env: dict | None = None, input: str | None = None) -> str:
    run = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, input=input,
                         env={**os.environ, **(env or {})})
    if check and run.returncode != 0:
        raise GitError(f"git {' '.join(args)} failed: {run.stderr.strip()}")
    return run.stdout


def check_repo(repo: Path) -> None:
    if not repo.is_dir():
        raise GitError(f"repository not found: {repo}")
    if subprocess.run(["git", "rev-parse", "--git-dir"], cwd=repo, capture_output=True).returncode != 0:
        raise GitError(f"not a git repository: {repo}")
    dirty = [line[3:] for line in git(repo, "status", "--porcelain", "--untracked-files=no").splitlines() if line]
    if dirty:
        shown = ", ".join(dirty[:5]) + (f" and {len(dirty) - 5} more" if len(dirty) > 5 else "")
        raise GitError(f"the work tree of {repo} has uncommitted changes ({shown}); commit or stash them first")


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


def identity(repo: Path) -> dict:
    if git(repo, "config", "user.name", check=False).strip() and git(repo, "config", "user.email", check=False).strip():
        return {}
    return {f"GIT_{who}_{what}": value for who in ("AUTHOR", "COMMITTER")
            for what, value in (("NAME", "lanekeeper"), ("EMAIL", "lanekeeper@localhost"))}
