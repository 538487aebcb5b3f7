"""The GitHub Actions workflows: `lanes` (a `changes` job picks the lanes, a job per lane and shard runs
each) and `rollback` (after a red run of `lanes` on main).  Which lanes run is decided as for Buildkite,
by ci.lanes.buildkite.plan."""
from __future__ import annotations

import json

from ci.rollback.history import shard_label
from ci.lanes.schema import Lane, shard_dir
from ci.lanes.buildkite import TOOLS, Build, lane_files, plan

RUNNERS = {"cpu": "ubuntu-latest", "gpu": ["self-hosted", "gpu"]}


def lane_matrix(lanes: list[Lane], build: Build) -> dict[str, list[dict]]:
    """The matrix of each lane job, by hardware: what the `changes` job hands on."""
    out: dict[str, list[dict]] = {hw: [] for hw in RUNNERS}
    files = lane_files(lanes, build)
    for lane in lanes:
        if plan(lane, build, files) != "run":
            continue
        entry = {"key": lane.key, "label": lane.label, "install": lane.ci_install, "shard": "",
                 "artifact": lane.key}
        if lane.shards == 1:
            out[lane.hardware].append(entry)
            continue
        for k in range(1, lane.shards + 1):   # one job per shard, named for it (history reads the name back)
            out[lane.hardware].append({**entry, "label": shard_label(lane.label, (k, lane.shards)),
                                       "shard": f"{k}/{lane.shards}", "artifact": f"{lane.key}-{shard_dir((k, lane.shards))}"})
    return out


def matrix_output(matrix: dict[str, list[dict]]) -> str:
    return "".join(f"{hw}={json.dumps(items, separators=(',', ':'))}\n" for hw, items in matrix.items())


def _setup(*extra: dict) -> list[dict]:
    return [{"uses": "actions/checkout@v5", "with": {"fetch-depth": 0}},
            {"uses": "actions/setup-python@v6",
             "with": {"python-version": "3.11", "cache": "pip", "cache-dependency-path": "pyproject.toml"}},
            *extra]


def lanes_workflow(lanes: list[Lane]) -> dict:
    jobs = {"changes": {
        "name": "Lanes for this run",
        "runs-on": "ubuntu-latest",
        "timeout-minutes": 15,
        "outputs": {hw: f"${{{{ steps.select.outputs.{hw} }}}}" for hw in RUNNERS},
        "steps": _setup(
            {"name": "Install", "run": TOOLS},
            {"name": "Select lanes", "id": "select", "env": {"BASE_REF": "${{ github.base_ref }}"},
             "run": ('git fetch -q origin "${BASE_REF:-main}" && lanekeeper pipeline github-lanes '
                     '--changed-since FETCH_HEAD >> "$GITHUB_OUTPUT"')}),
    }}
    for hw, runner in RUNNERS.items():
        timeout = max((l.timeout_minutes for l in lanes if l.hardware == hw), default=None)
        if timeout is None:
            continue
        jobs[f"{hw}-lanes"] = {
            "name": "${{ matrix.lane.label }}",
            "needs": "changes",
            "if": f"needs.changes.outputs.{hw} != '[]'",
            "runs-on": runner,
            "timeout-minutes": timeout,
            "strategy": {"fail-fast": False, "matrix": {"lane": f"${{{{ fromJSON(needs.changes.outputs.{hw}) }}}}"}},
            "env": {"LANE": "${{ matrix.lane.key }}", "LANE_INSTALL": "${{ matrix.lane.install }}",
                    "SHARD": "${{ matrix.lane.shard }}"},
            "steps": _setup(
                {"name": "Install", "run": 'bash -c "$LANE_INSTALL"'},
                {"name": "Run lane", "run": 'lanekeeper run "$LANE" --artifacts "artifacts/$LANE" ${SHARD:+--shard "$SHARD"}'},
                {"name": "Matrix summary", "if": "always()",
                 "run": 'lanekeeper report --junit "artifacts/$LANE" --format markdown --exit-zero >> "$GITHUB_STEP_SUMMARY"'},
                {"name": "Upload artifacts", "if": "always()", "uses": "actions/upload-artifact@v6",
                 "with": {"name": "${{ matrix.lane.artifact }}", "path": "artifacts/${{ matrix.lane.key }}",
                          "if-no-files-found": "warn"}}),
        }
    return {
        "name": "lanes",
        "on": {"push": {"branches": ["main"]},
               "pull_request": {"types": ["opened", "synchronize", "reopened", "labeled"]},
               "workflow_dispatch": {},
               "schedule": [{"cron": "0 3 * * *"}]},
        "permissions": {"contents": "read"},
        # A newer push to a pull request supersedes its older run; runs on main are never cancelled.
        "concurrency": {"group": "lanes-${{ github.event.pull_request.number || github.sha }}",
                        "cancel-in-progress": "${{ github.event_name == 'pull_request' }}"},
        "jobs": jobs,
    }


def rollback_workflow(lanes: list[Lane]) -> dict:
    """Runs when the lanes workflow completes red on main.  GITHUB_TOKEN pushes the branch; the pull
    request is opened with LANEKEEPER_PR_TOKEN (a GitHub App token or a PAT) when the repository has
    one, since a pull request opened with the default token starts no workflow run of its own."""
    steps = _setup({"name": "Install", "run": TOOLS})
    for lane in (l for l in lanes if l.trigger == "merge_only"):
        if lane.ci_install != TOOLS:   # isolation re-runs the lane's tests: with the lane's own extras
            steps.append({"name": f"Install for {lane.key}", "run": lane.ci_install})
        steps.append({"name": f"Rollback check {lane.key}",
                      "run": (f'lanekeeper rollback --lane {lane.key} --github "$GITHUB_REPOSITORY" '
                              "--workflow lanes.yml --apply --push origin --open-pr --isolate"),
                      "env": {"GITHUB_TOKEN": "${{ secrets.LANEKEEPER_PR_TOKEN || secrets.GITHUB_TOKEN }}"}})
    return {
        "name": "rollback",
        "on": {"workflow_run": {"workflows": ["lanes"], "types": ["completed"], "branches": ["main"]}},
        "permissions": {"contents": "write", "pull-requests": "write", "actions": "read"},
        "concurrency": {"group": "rollback", "cancel-in-progress": False},
        "jobs": {"rollback": {
            "name": "Roll back a default that turned a merge-only lane red",
            "if": "github.event.workflow_run.conclusion == 'failure'",
            "runs-on": "ubuntu-latest",
            "timeout-minutes": 30 + sum(l.timeout_minutes for l in lanes if l.trigger == "merge_only"),
            "steps": steps,
        }},
    }
