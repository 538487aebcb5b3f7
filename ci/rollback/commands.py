"""`lanekeeper rollback | history add`: roll a profile default back when a merge-only lane turned red, from
the lane's history (a file, Buildkite or GitHub), and record lane runs as that history."""
from __future__ import annotations

import json
import os
from pathlib import Path

from ci.run import ci_api
from ci.run import junit
from ci.lanes import schema as lanes
from engine.serve.argtypes import seconds, whole_number
from ci.git import GitError, check_repo, git, remote_ref
from ci.rollback.repo import REVIEW
from ci.rollback.decision import Reason
from ci.run.commands import api_deadline_arg, lanes_file
from engine.errors import UserError, did_you_mean
from engine.profile.location import require_checkout


def _open_pr_for(slug: str):
    """The open pull request whose head is a branch of `slug`, or None."""
    owner = slug.split("/")[0]
    root = ci_api._root("github")

    def find(branch: str) -> dict | None:
        from urllib.parse import quote

        pulls = ci_api.get_json("github", f"{root}/repos/{slug}/pulls?state=open&head={quote(f'{owner}:{branch}')}")
        return pulls[0] if isinstance(pulls, list) and pulls else None

    return find


def _builds(args):
    """The lane's history, from the file or CI API the arguments name."""
    from ci.rollback import history

    if args.history:
        return history.load_file(args.history)
    if args.buildkite:
        return history.from_buildkite(args.buildkite)
    if not args.workflow:
        raise history.HistoryError("--github needs --workflow NAME (the workflow file, e.g. lanes.yml)")
    return history.from_github(args.github, args.workflow)


def _keys(text: str | None, profile: str) -> list[str] | None:
    """`--keys`, each a key the lane's profile resolves (a typo is a usage error, not a quiet "no action")."""
    if not text:
        return None
    from engine.profile.resolve import resolve

    keys = [k.strip() for k in text.split(",") if k.strip()]
    known = resolve(profile, platform="cpu").flat()
    for key in keys:
        if key not in known:
            raise UserError(f"--keys {key}: profile {profile} has no such key{did_you_mean(key, known)} "
                            "(`lanekeeper profile show --explain` lists them)")
    return keys


def cmd_rollback(args) -> int:
    from ci.rollback import history
    from ci.rollback import rules as rollback
    from ci.rollback import branch as rollback_branch

    lane = lanes.find(args.lane, lanes.load(args.lanes_file))
    keys = _keys(args.keys, lane.profile)
    repo = Path(args.repo).resolve() if args.repo else require_checkout("lanekeeper rollback")
    check_repo(repo)
    slug = args.github or os.environ.get("GITHUB_REPOSITORY")
    if args.open_pr and not slug:
        raise history.HistoryError("--open-pr needs --github OWNER/REPO or GITHUB_REPOSITORY")
    builds = _builds(args)
    audit = rollback_branch.Audit(repo, args.push)
    decision = rollback.decide(builds, lane, repo, args.min_red, audit, keys=keys, remote=args.push,
                               pr_for=_open_pr_for(slug) if args.open_pr else None,
                               isolate_budget=args.isolate_budget if args.isolate else None)
    print(f"lanekeeper rollback: lane {lane.key} ({lane.label}), profile {lane.profile}")
    for line in decision.evidence:
        print(f"  {line}")
    record = {"lane": lane.key, "culprit": decision.culprit, "keys": decision.keys, "code": decision.code.value,
              "facts": decision.facts, "reason": decision.reason,
              "builds": [b.number for b in decision.reds], "branch": decision.branch, "isolation": decision.isolation}
    if not decision.act:
        audit.append({**record, "action": "none"})
        print(f"no action [{decision.code.value}]: {decision.reason}")
        return 0
    if decision.others:
        print(f"  {REVIEW.lower()} {', '.join(decision.others)}")
    if not args.apply:
        audit.append({**record, "action": "dry_run"})
        what = "roll back" if decision.action == "rollback" else f"add this lane's evidence to {decision.branch}"
        print(f"would {what} ({decision.reason}); dry run: pass --apply to do it")
        return 0
    if decision.action == "evidence":
        sha = rollback_branch.add_evidence(decision, lane, repo)
        audit.append({**record, "action": "evidence", "commit": sha})
        print(f"evidence added: {decision.reason}" + (f"; commit {sha[:12]}" if sha else ""))
        _publish(args, repo, lane, decision, slug, rollback_branch.evidence_message(decision, lane, repo))
        return 0
    try:
        branch, sha, restored, note = rollback_branch.apply(decision, lane, repo, args.verify)
    except rollback_branch.VerifyFailed as e:
        audit.append({**record, "action": "verify_failed", "detail": str(e)[:4000]})
        print(f"rollback not made: {e}")
        return 1
    print(f"rolled back: branch {branch}, commit {sha[:12]} ({decision.reason})")
    for line in restored:
        print(f"  restored {line}")
    print(f"  {note}")
    _publish(args, repo, lane, decision, slug, git(repo, "log", "-1", "--format=%B", sha))
    # recorded once published: a rollback that lost a push race to another lane's is that lane's evidence
    action = "applied" if decision.action == "rollback" else "evidence"
    audit.append({**record, "action": action, "commit": sha, "restored": restored, "verify": note})
    return 0


def _publish(args, repo: Path, lane, decision, slug: str | None, message: str) -> None:
    """Push the branch and open its pull request, or comment on the one already open."""
    from ci.rollback import branch as rollback_branch

    if args.push and git(repo, "rev-parse", "--verify", "--quiet", f"refs/heads/{decision.branch}",
                                  check=False).strip():
        try:
            git(repo, "push", "-q", args.push, f"{decision.branch}:{decision.branch}")
        except GitError:
            # Another lane's job pushed a rollback of the same culprit first: ours becomes evidence on theirs.
            existing = remote_ref(repo, decision.branch, args.push) if decision.action == "rollback" else None
            if not existing:
                raise
            decision.code, decision.existing = Reason.EVIDENCE, existing
            decision.facts["where"] = f"branch {decision.branch}"
            sha = rollback_branch.add_evidence(decision, lane, repo)
            message = rollback_branch.evidence_message(decision, lane, repo)
            decision.pr = _open_pr_for(slug)(decision.branch) if args.open_pr else None
            git(repo, "push", "-q", args.push, f"{decision.branch}:{decision.branch}")
            print(f"  {decision.branch} was pushed by another lane meanwhile: evidence {sha[:12]} added to it instead")
        print(f"  pushed {decision.branch} to {args.push}")
    if not args.open_pr:
        return
    root = ci_api._root("github")
    if decision.pr:
        ci_api.get("github", f"{root}/repos/{slug}/issues/{decision.pr['number']}/comments", data={"body": message})
        print(f"  commented on {decision.pr.get('html_url', 'the open pull request')}")
        return
    pr = json.loads(ci_api.get("github", f"{root}/repos/{slug}/pulls", data={
        "title": message.splitlines()[0], "head": decision.branch, "base": "main", "body": message}))
    print(f"  opened {pr.get('html_url', 'a pull request')}")


def cmd_history_add(args) -> int:
    """Record one lane run (its JUnit file) as a build in a history file."""
    from ci.rollback import history

    lane = lanes.find(args.lane, lanes.load(args.lanes_file))
    cases = junit.parse(args.junit)
    red = not cases or any(c.status in ("failed", "error") for c in cases)
    path = Path(args.history)
    builds = history.load_file(path) if path.exists() else []
    number = args.number or max((b.number for b in builds), default=0) + 1
    builds.append(history.Build(number, args.commit, args.branch, args.url or "",
                                {lane.key: [history.LaneResult("failed" if red else "passed", 1 if red else 0)]}))
    history.dump_file(builds, path)
    print(f"recorded build #{number} at {args.commit[:12]}: {lane.key} {'red' if red else 'green'}")
    return 0


def add_parsers(sub) -> None:
    p = sub.add_parser("rollback", help="roll back a profile default that turned a merge-only lane red")
    p.add_argument("--lane", required=True, help="lane key or label")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--history", help="lane history file (JSON; see README)")
    src.add_argument("--buildkite", metavar="ORG/PIPELINE", help="read the history from Buildkite builds of main")
    src.add_argument("--github", metavar="OWNER/REPO", help="read the history from GitHub workflow runs on main")
    p.add_argument("--workflow", help="GitHub workflow file or id (with --github)")
    p.add_argument("--repo", help="git repository (default: the checkout at or above the working directory)")
    p.add_argument("--apply", action="store_true", help="create the rollback branch and commit (default: dry run)")
    p.add_argument("--verify", choices=("config", "lane", "none"), default="config",
                   help="run tests/config or the lane on the rollback commit before keeping it (default: %(default)s)")
    p.add_argument("--isolate", action="store_true",
                   help="when the culprit changed several keys, or several commits are candidates, run the lane's "
                        "failing tests with each one reverted alone and roll back only the one that turns them green")
    p.add_argument("--isolate-budget", type=seconds, default=900.0, metavar="SECONDS",
                   help="stop isolating after this long and fall back (default: %(default)s)")
    p.add_argument("--min-red", type=whole_number(1), default=2,
                   help="red builds on distinct commits needed (default: 2)")
    p.add_argument("--keys", metavar="KEY[,KEY...]",
                   help="restore only these of the keys the culprit changed (default: all of them)")
    p.add_argument("--push", metavar="REMOTE", help="push the branch there (its branches count as existing rollbacks)")
    p.add_argument("--open-pr", action="store_true",
                   help="open a pull request, or comment on the rollback's open one (GitHub)")
    api_deadline_arg(p)
    lanes_file(p)
    p.set_defaults(func=cmd_rollback)

    p = sub.add_parser("history", help="lane history files")
    hsub = p.add_subparsers(dest="history_command", required=True)
    p = hsub.add_parser("add", help="record a lane run's JUnit result as a build")
    p.add_argument("history", help="history file (created when missing)")
    p.add_argument("--lane", required=True, help="lane key or label the run was")
    p.add_argument("--junit", required=True, help="the run's JUnit XML file")
    p.add_argument("--commit", required=True, help="commit the run tested")
    p.add_argument("--number", type=int, help="build number (default: the last one + 1)")
    p.add_argument("--branch", default="main", help="default: %(default)s")
    p.add_argument("--url", help="link to the build")
    lanes_file(p)
    p.set_defaults(func=cmd_history_add)
