"""`lanekeeper lanes | run | pipeline | report | repro`: lanes as CI runs them, and their results."""
from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

from ci.run import ci_api
from ci.lanes import github as github_workflows
from ci.run import junit
from ci.run import record
from ci.lanes import schema as lanes
from ci.lanes import buildkite as pipelines
from ci.run import report
from ci.run import lane as run_lane
from engine.profile.location import find_checkout, require_checkout
from engine.serve.argtypes import seconds, shard


def cmd_lanes(args) -> int:
    all_lanes = lanes.load(args.lanes_file)
    if args.what:
        if args.what[0] != "deps" or len(args.what) != 2:
            raise lanes.LaneError(f"lanes {' '.join(args.what)}: expected `lanes` or `lanes deps LANE`")
        return lane_deps(lanes.find(args.what[1], all_lanes), all_lanes)
    if args.json:
        print(json.dumps([lane.model_dump() for lane in all_lanes], indent=2))
        return 0
    width = max(len(lane.key) for lane in all_lanes)
    for lane in all_lanes:
        print(f"{lane.key:<{width}}  {lane.trigger:<10}  {lane.hardware:<3}  {lane.label}")
    return 0


def lane_deps(lane, all_lanes) -> int:
    """Each file the lane depends on, with the chain that reaches it: what a change must touch to run it."""
    from ci.lanes import deps

    root = require_checkout("lanekeeper lanes deps")
    graph = deps.Graph(root)
    found = graph.deps(lane)
    graph.check_extras(lane, found)
    for path in sorted(found):
        print(f"{path}\n    {' -> '.join(found[path].chain)}")
    for extra in lane.source_file_dependencies:
        print(f"{extra}\n    source_file_dependencies of lane {lane.key}")
    print(f"lanekeeper: lane {lane.key} depends on {len(found) + len(lane.source_file_dependencies)} paths in {root}",
          file=sys.stderr)
    return 0


def cmd_run(args) -> int:
    lane = lanes.find(args.lane, lanes.load(args.lanes_file))
    shard = args.shard or lane.shard_from_env()
    return run_lane.run(lane, args.artifacts, args.platform, args.dry_run, shard=shard, extra=args.pytest_args)


def cmd_pipeline(args) -> int:
    kind = args.kind
    if kind == "buildkite-bootstrap":
        sys.stdout.write(pipelines.dump(pipelines.buildkite_bootstrap(), kind))
        return 0
    if kind == "github":
        data = github_workflows.rollback_workflow if args.workflow == "rollback" else github_workflows.lanes_workflow
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
    if kind == "buildkite" and not build.from_ci and args.event is None and build.on_main \
            and any(l.trigger == "merge_only" for l in all_lanes):
        raise lanes.LaneError("without Buildkite variables the event is a guess (push to main), and a push to "
                              "main gets `rollback --apply --push` steps; pass --event (push, pull_request, "
                              "schedule or manual) to say what this build is")
    ci_name = "Buildkite" if kind == "buildkite" else "GitHub Actions"
    print(f"lanekeeper: {kind} from {args.lanes_file or lanes.default_lanes_file()} for {build.describe()}"
          + ("" if build.from_ci else
          f" (no {ci_name} variables here: assumed where not given)"), file=sys.stderr)
    if kind == "buildkite":
        sys.stdout.write(pipelines.dump(pipelines.buildkite(all_lanes, build), "buildkite"))
    else:
        sys.stdout.write(github_workflows.matrix_output(github_workflows.lane_matrix(all_lanes, build)))
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
    records = {path: record.read(path) for path in files}
    record.check_one_run(records)
    cases = [c for path in files for c in junit.parse(path)]
    summary = report.summarize(cases, find_checkout() or Path.cwd())
    stall_reports = [Path(p).parent / "stall-report.md" for p in files if (Path(p).parent / "stall-report.md").exists()]
    runs = list(records.values())
    if args.annotate:   # Buildkite serves uploaded artifacts at artifact:// links inside annotations
        text = report.render(summary, "markdown", report.run_notes(
            runs, [f"[stall report: {r.parent.name}](artifact://{r})" for r in stall_reports]))
        skipped = annotate(text, report.annotation_style(summary))
        if skipped:
            print(f"lanekeeper: annotation skipped: {skipped}; the report follows", file=sys.stderr)
    if not args.annotate or skipped:
        text = report.render(summary, args.format, report.run_notes(runs, list(map(str, stall_reports))))
    sys.stdout.write(text)
    return 1 if report.red(summary) and not args.exit_zero else 0


def annotate(text: str, style: str) -> str | None:
    """Annotate the Buildkite build; why it could not, or None."""
    agent = shutil.which("buildkite-agent")
    if agent is None:
        return "buildkite-agent is not on the PATH (not a Buildkite job)"
    run = subprocess.run([agent, "annotate", "--style", style, "--context", "lanekeeper-matrix"], input=text,
                         text=True, capture_output=True)
    if run.returncode != 0:
        return f"buildkite-agent annotate exited {run.returncode}: {(run.stderr.strip().splitlines() or [''])[-1]}"
    return None


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
    ids = junit.failed_ids(cases, find_checkout() or Path.cwd())
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
    adhoc = adhoc.model_copy(update={"key": "repro"})   # its own artifacts/repro, not the lane's
    return run_lane.run(adhoc, args.artifacts, args.platform, args.dry_run, extra=args.pytest_args)


def api_deadline_arg(p) -> None:
    p.add_argument("--api-deadline", type=seconds, metavar="SECONDS",
                   help="give up on the CI API after this long, retries included "
                        "(default: LANEKEEPER_API_DEADLINE or 60)")


def lanes_file(p) -> None:
    p.add_argument("--lanes-file", default=None, help="lanes file (default: the checkout's ci/lanes.yaml)")


def add_parsers(sub) -> None:
    _lanes_and_run_parsers(sub)
    _pipeline_parser(sub)
    _report_parsers(sub)


def _lanes_and_run_parsers(sub) -> None:
    p = sub.add_parser("lanes", help="list the CI lanes, or the files one depends on")
    p.add_argument("--json", action="store_true", help="print every lane's settings as JSON")
    p.add_argument("what", nargs="*", metavar="deps LANE", help="print the files LANE depends on (its tests, what "
                                                              "they import and read), each with the chain that reaches it")
    lanes_file(p)
    p.set_defaults(func=cmd_lanes)

    p = sub.add_parser("run", help="run a lane locally exactly as CI does",
                       epilog="lanekeeper run LANE [options] -- PYTEST_ARGS passes the rest to pytest (-x, -k EXPR)")
    p.add_argument("lane", help="lane key or label")
    p.add_argument("--platform", choices=("cpu", "cuda"), help="platform to resolve profiles for (default: the lane's)")
    p.add_argument("--artifacts", help="directory for JUnit XML and reports, emptied of an earlier run's files "
                                       "first (default: the checkout's artifacts/KEY)")
    p.add_argument("--dry-run", action="store_true", help="print the command instead of running it")
    p.add_argument("--shard", type=shard, metavar="K/N",
                   help="run only shard K of N (default: on Buildkite, this parallel job's shard of a lane with "
                        "shards; elsewhere the whole lane)")
    lanes_file(p)
    p.set_defaults(func=cmd_run)



def _pipeline_parser(sub) -> None:
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



def _report_parsers(sub) -> None:
    p = sub.add_parser("report", help="matrix table from JUnit files")
    p.add_argument("--junit", nargs="+", required=True, help="JUnit XML files of one or more lane runs; a directory means every junit.xml under it (all shards of a lane)")
    p.add_argument("--format", choices=("markdown", "json"), default="markdown", help="default: %(default)s")
    p.add_argument("--annotate", action="store_true",
                   help="also annotate the Buildkite build (style error when red, success when green); without "
                        "buildkite-agent it only prints, and says so")
    p.add_argument("--exit-zero", action="store_true", help="exit 0 even when the run was red (default: exit 1)")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("repro", help="re-run the failed tests of a CI run",
                       epilog="lanekeeper repro ... -- PYTEST_ARGS passes the rest to pytest")
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
    p.add_argument("--artifacts", help="directory for the re-run's JUnit XML and reports (default: the checkout's "
                                       "artifacts/repro)")
    p.add_argument("--dry-run", action="store_true", help="print the command instead of running it")
    api_deadline_arg(p)
    lanes_file(p)
    p.set_defaults(func=cmd_repro)
