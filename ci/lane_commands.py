"""`lanekeeper lanes | run | pipeline | report | repro`."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

from ci import ci_api, junit, lanes, pipelines, report, run_lane
from ci.argtypes import seconds, shard, whole_number


def cmd_lanes(args) -> int:
    all_lanes = lanes.load(args.lanes_file)
    if args.json:
        print(json.dumps([lane.model_dump() for lane in all_lanes], indent=2))
        return 0
    width = max(len(lane.key) for lane in all_lanes)
    for lane in all_lanes:
        print(f"{lane.key:<{width}}  {lane.trigger:<10}  {lane.hardware:<3}  {lane.label}")
    return 0


def cmd_run(args) -> int:
    lane = lanes.find(args.lane, lanes.load(args.lanes_file))
    artifacts = args.artifacts or f"artifacts/{lane.key}"
    shard = args.shard or lane.shard_from_env()
    if shard is not None:   # each shard's JUnit and reports apart; `report --junit artifacts/KEY` merges them
        artifacts = os.path.join(artifacts, lanes.shard_dir(shard))
    return run_lane.run(lane, artifacts, args.platform, args.dry_run, shard=shard)


def cmd_pipeline(args) -> int:
    kind = args.kind
    if kind == "buildkite-bootstrap":
        sys.stdout.write(pipelines.dump(pipelines.buildkite_bootstrap(), kind))
        return 0
    if kind == "github":
        data = pipelines.github_rollback if args.workflow == "rollback" else pipelines.github
        suffix = " --workflow rollback" if args.workflow == "rollback" else ""
        sys.stdout.write(pipelines.dump(data(lanes.load(args.lanes_file)), f"github{suffix}"))
        return 0
    all_lanes = lanes.load(args.lanes_file)
    changed = None
    if args.changed_files:
        try:
            changed = tuple(l.strip() for l in Path(args.changed_files).read_text().splitlines() if l.strip())
        except OSError as e:
            raise lanes.LaneError(f"--changed-files {args.changed_files}: {e.strerror}") from None
    elif args.changed_since:
        changed = pipelines.changed_since(args.changed_since)
    build = (pipelines.buildkite_build if kind == "buildkite" else pipelines.github_build)(changed)
    overrides = {k: v for k, v in (("event", args.event), ("branch", args.branch)) if v is not None}
    if args.labels is not None:
        overrides["labels"] = frozenset(l.strip() for l in args.labels.split(",") if l.strip())
    build = dataclasses.replace(build, **overrides)
    if kind == "buildkite":
        sys.stdout.write(pipelines.dump(pipelines.buildkite(all_lanes, build), "buildkite"))
    else:
        sys.stdout.write(pipelines.github_output(pipelines.github_lanes(all_lanes, build)))
    return 0


def junit_files(paths: list[str]) -> list[str]:
    """JUnit files, a directory standing for every junit.xml under it (a sharded lane's artifacts)."""
    out = []
    for p in paths:
        if Path(p).is_dir():
            found = sorted(str(f) for f in Path(p).rglob("junit.xml"))
            if not found:
                raise junit.JunitError(f"{p}: no junit.xml under this directory")
            out += found
        else:
            out.append(p)
    return out


def cmd_report(args) -> int:
    files = junit_files(args.junit)
    cases = [c for path in files for c in junit.parse(path)]
    summary = report.summarize(cases)
    stall_reports = [Path(p).parent / "stall-report.md" for p in files if (Path(p).parent / "stall-report.md").exists()]
    if args.annotate:   # Buildkite serves uploaded artifacts at artifact:// links inside annotations
        notes = [f"[stall report: {r.parent.name}](artifact://{r})" for r in stall_reports]
        text = report.render(summary, "markdown", notes)
        run = subprocess.run(["buildkite-agent", "annotate", "--style", report.annotation_style(summary),
                              "--context", "lanekeeper-matrix"], input=text, text=True)
        if run.returncode != 0:
            raise junit.JunitError(f"buildkite-agent annotate failed with status {run.returncode}")
        sys.stdout.write(text)
        return 0
    sys.stdout.write(report.render(summary, args.format, [f"Stall report: {r}" for r in stall_reports]))
    return 0


def _fetch(args) -> dict[str, bytes | None]:
    """The JUnit reports of the run to reproduce: of one shard only, with --shard."""
    if args.junit:
        files = junit_files([args.junit])
        if args.shard:
            files = [f for f in files if lanes.shard_dir(args.shard) in Path(f).parts]
            if not files:
                raise junit.JunitError(f"{args.junit}: no {lanes.shard_dir(args.shard)}/junit.xml under it")
        return dict.fromkeys(files)
    if args.buildkite:
        return ci_api.buildkite_junits(args.buildkite, args.job, args.shard)
    return ci_api.github_junits(args.github, args.job, args.shard and lanes.shard_dir(args.shard))


def cmd_repro(args) -> int:
    sources = _fetch(args)
    cases = []
    for name, data in sources.items():
        cases += junit.parse(name, data)
    ids = junit.failed_ids(cases, lanes.ROOT)
    all_lanes = lanes.load(args.lanes_file)
    suite = next((c.suite for c in cases if c.suite), None)
    lane = lanes.find(args.lane, all_lanes) if args.lane else \
        next((l for l in all_lanes if l.key == suite), None)
    if not ids:
        print("lanekeeper: no failed or errored tests in that run; nothing to reproduce")
        return 0
    print(f"lanekeeper: reproducing {len(ids)} failed test(s)" + (f" with lane {lane.key}'s settings" if lane else ""))
    for nodeid in ids:
        print(f"  {nodeid}")
    base = lane or lanes.Lane(key="repro", label="repro", trigger="per_commit", paths=["tests"],
                              timeout=300, budget=3600)
    adhoc = base.model_copy(update={"paths": ids, "markers": None, "keyword": None})
    artifacts = args.artifacts or "artifacts/repro"
    return run_lane.run(adhoc, artifacts, args.platform, args.dry_run)


def _open_pr_for(slug: str):
    """The open pull request whose head is a branch of `slug`, or None."""
    owner = slug.split("/")[0]
    root = ci_api._root("github")

    def find(branch: str) -> dict | None:
        from urllib.parse import quote

        pulls = ci_api.get_json("github", f"{root}/repos/{slug}/pulls?state=open&head={quote(f'{owner}:{branch}')}")
        return pulls[0] if isinstance(pulls, list) and pulls else None

    return find


def cmd_rollback(args) -> int:
    from ci import history, rollback

    lane = lanes.find(args.lane, lanes.load(args.lanes_file))
    repo = Path(args.repo).resolve()
    rollback.check_repo(repo)
    slug = args.github or os.environ.get("GITHUB_REPOSITORY")
    if args.open_pr and not slug:
        raise history.HistoryError("--open-pr needs --github OWNER/REPO or GITHUB_REPOSITORY")
    if args.history:
        builds = history.load_file(args.history)
    elif args.buildkite:
        builds = history.from_buildkite(args.buildkite)
    else:
        if not args.workflow:
            raise history.HistoryError("--github needs --workflow NAME (the workflow file, e.g. lanes.yml)")
        builds = history.from_github(args.github, args.workflow)
    keys = [k.strip() for k in args.keys.split(",") if k.strip()] if args.keys else None
    audit = rollback.Audit(repo, args.push)
    decision = rollback.decide(builds, lane, repo, args.min_red, audit, keys=keys, remote=args.push,
                               pr_for=_open_pr_for(slug) if args.open_pr else None)
    print(f"lanekeeper rollback: lane {lane.key} ({lane.label}), profile {lane.profile}")
    for line in decision.evidence:
        print(f"  {line}")
    record = {"lane": lane.key, "culprit": decision.culprit, "keys": decision.keys, "reason": decision.reason,
              "builds": [b.number for b in decision.reds], "branch": decision.branch}
    if not decision.act:
        audit.append({**record, "action": "none"})
        print(f"no action: {decision.reason}")
        return 0
    if decision.others:
        print(f"  {rollback.REVIEW.lower()} {', '.join(decision.others)}")
    if not args.apply:
        audit.append({**record, "action": "dry_run"})
        what = "roll back" if decision.action == "rollback" else f"add this lane's evidence to {decision.branch}"
        print(f"would {what} ({decision.reason}); dry run: pass --apply to do it")
        return 0
    if decision.action == "evidence":
        sha = rollback.add_evidence(decision, lane, repo)
        audit.append({**record, "action": "evidence", "commit": sha})
        print(f"evidence added: {decision.reason}" + (f"; commit {sha[:12]}" if sha else ""))
        _publish(args, repo, lane, decision, slug, rollback.evidence_message(decision, lane, repo))
        return 0
    try:
        branch, sha, restored, note = rollback.apply(decision, lane, repo, args.verify)
    except rollback.VerifyFailed as e:
        audit.append({**record, "action": "verify_failed", "detail": str(e)[:4000]})
        print(f"rollback not made: {e}")
        return 1
    print(f"rolled back: branch {branch}, commit {sha[:12]} ({decision.reason})")
    for line in restored:
        print(f"  restored {line}")
    print(f"  {note}")
    _publish(args, repo, lane, decision, slug, rollback.git(repo, "log", "-1", "--format=%B", sha))
    # recorded once published: a rollback that lost a push race to another lane's is that lane's evidence
    action = "applied" if decision.action == "rollback" else "evidence"
    audit.append({**record, "action": action, "commit": sha, "restored": restored, "verify": note})
    return 0


def _publish(args, repo: Path, lane, decision, slug: str | None, message: str) -> None:
    """Push the branch and open its pull request, or comment on the one already open."""
    from ci import rollback

    if args.push and rollback.git(repo, "rev-parse", "--verify", "--quiet", f"refs/heads/{decision.branch}",
                                  check=False).strip():
        try:
            rollback.git(repo, "push", "-q", args.push, f"{decision.branch}:{decision.branch}")
        except rollback.RollbackError:
            # Another lane's job pushed a rollback of the same culprit first: ours becomes evidence on theirs.
            existing = rollback.remote_ref(repo, decision.branch, args.push) if decision.action == "rollback" else None
            if not existing:
                raise
            decision.action, decision.existing = "evidence", existing
            sha = rollback.add_evidence(decision, lane, repo)
            message = rollback.evidence_message(decision, lane, repo)
            decision.pr = _open_pr_for(slug)(decision.branch) if args.open_pr else None
            rollback.git(repo, "push", "-q", args.push, f"{decision.branch}:{decision.branch}")
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
    from ci import history

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


def _api_deadline(p) -> None:
    p.add_argument("--api-deadline", type=seconds, metavar="SECONDS",
                   help="give up on the CI API after this long, retries included "
                        "(default: LANEKEEPER_API_DEADLINE or 60)")


def add_parsers(sub) -> None:
    def lanes_file(p):
        p.add_argument("--lanes-file", default=str(lanes.LANES_FILE), help="lanes file (default: ci/lanes.yaml)")

    p = sub.add_parser("lanes", help="list the CI lanes")
    p.add_argument("--json", action="store_true", help="print every lane's settings as JSON")
    lanes_file(p)
    p.set_defaults(func=cmd_lanes)

    p = sub.add_parser("run", help="run a lane locally exactly as CI does")
    p.add_argument("lane", help="lane key or label")
    p.add_argument("--platform", choices=("cpu", "cuda"), help="platform to resolve profiles for (default: the lane's)")
    p.add_argument("--artifacts", help="directory for JUnit XML and reports (default: artifacts/KEY)")
    p.add_argument("--dry-run", action="store_true", help="print the command instead of running it")
    p.add_argument("--shard", type=shard, metavar="K/N",
                   help="run only shard K of N (default: on Buildkite, this parallel job's shard of a lane with "
                        "shards; elsewhere the whole lane)")
    lanes_file(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("pipeline", help="print a generated CI pipeline, or this build's lanes")
    p.add_argument("kind", choices=("buildkite-bootstrap", "buildkite", "github", "github-lanes"),
                   help="buildkite-bootstrap: the committed Buildkite pipeline; buildkite: the steps this build "
                        "uploads; github: the committed workflow; github-lanes: this run's lane matrix "
                        "(GITHUB_OUTPUT lines)")
    changes = p.add_mutually_exclusive_group()
    changes.add_argument("--changed-files", help="file listing the changed paths, one a line")
    changes.add_argument("--changed-since", metavar="REF", help="the paths changed since the merge base with REF")
    p.add_argument("--event", choices=("push", "pull_request", "schedule", "manual"),
                   help="what started the build (default: from the CI's variables)")
    p.add_argument("--branch", help="the build's branch (default: from the CI's variables)")
    p.add_argument("--labels", metavar="L1,L2", help=f"the pull request's labels ({pipelines.MERGE_LABEL} runs "
                                                      "merge-only lanes; default: from the CI's variables)")
    p.add_argument("--workflow", choices=("lanes", "rollback"), default="lanes",
                   help="github: the lanes workflow or the rollback workflow")
    lanes_file(p)
    p.set_defaults(func=cmd_pipeline)

    p = sub.add_parser("report", help="matrix table from JUnit files")
    p.add_argument("--junit", nargs="+", required=True, help="JUnit XML files of one or more lane runs; a directory means every junit.xml under it (all shards of a lane)")
    p.add_argument("--format", choices=("markdown", "json"), default="markdown", help="default: %(default)s")
    p.add_argument("--annotate", action="store_true",
                   help="also annotate the Buildkite build (style error when red, success when green)")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("rollback", help="roll back a profile default that turned a merge-only lane red")
    p.add_argument("--lane", required=True, help="lane key or label")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--history", help="lane history file (JSON; see README)")
    src.add_argument("--buildkite", metavar="ORG/PIPELINE", help="read the history from Buildkite builds of main")
    src.add_argument("--github", metavar="OWNER/REPO", help="read the history from GitHub workflow runs on main")
    p.add_argument("--workflow", help="GitHub workflow file or id (with --github)")
    p.add_argument("--repo", default=".", help="git repository (default: .)")
    p.add_argument("--apply", action="store_true", help="create the rollback branch and commit (default: dry run)")
    p.add_argument("--verify", choices=("config", "lane", "none"), default="config",
                   help="run tests/config or the lane on the rollback commit before keeping it (default: %(default)s)")
    p.add_argument("--min-red", type=whole_number(1), default=2,
                   help="red builds on distinct commits needed (default: 2)")
    p.add_argument("--keys", metavar="KEY[,KEY...]",
                   help="restore only these of the keys the culprit changed (default: all of them)")
    p.add_argument("--push", metavar="REMOTE", help="push the branch there (its branches count as existing rollbacks)")
    p.add_argument("--open-pr", action="store_true",
                   help="open a pull request, or comment on the rollback's open one (GitHub)")
    _api_deadline(p)
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

    p = sub.add_parser("repro", help="re-run the failed tests of a CI run")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--junit", help="JUnit XML file of the run; a directory means every junit.xml under it")
    src.add_argument("--buildkite", metavar="BUILD_URL", help="a Buildkite build: its JUnit artifacts")
    src.add_argument("--github", metavar="RUN_URL", help="a GitHub Actions run: its JUnit artifacts")
    p.add_argument("--job", help="only this job (Buildkite label) or artifact (GitHub)")
    p.add_argument("--shard", type=shard, metavar="K/N",
                   help="only shard K of N of a sharded lane: Buildkite parallel job K, the GitHub artifact "
                        "KEY-shard-K-of-N, or shard-K-of-N/junit.xml under a --junit directory")
    p.add_argument("--lane", help="lane whose env and timeouts to use (default: the JUnit suite's lane)")
    p.add_argument("--platform", choices=("cpu", "cuda"), help="platform to resolve profiles for (default: the lane's)")
    p.add_argument("--artifacts", help="directory for the re-run's JUnit XML and reports (default: artifacts/repro)")
    p.add_argument("--dry-run", action="store_true", help="print the command instead of running it")
    _api_deadline(p)
    lanes_file(p)
    p.set_defaults(func=cmd_repro)
