"""Lane history: builds on main and how each lane did, from a file, Buildkite or GitHub.

A lane result is classified by state and signal reason, not by exit status alone:
Buildkite reports -1 both for a lost agent (infrastructure) and for a job killed at its
timeout (a real red, often a hang), and the latter has state `timed_out`.

History file format (JSON):

    {"builds": [
      {"number": 12, "commit": "<sha>", "branch": "main", "finished_at": "2026-12-01T10:00:00Z",
       "url": "https://...", "lanes": {
         "tts-base": {"state": "passed", "exit_status": 0, "soft_failed": false, "retried": false,
                      "signal_reason": null}}}]}

Lanes are keyed by lane key or label.  `state` is one of passed, failed, timed_out,
canceled, broken, skipped (GitHub conclusions success/failure/cancelled/timed_out map
onto these).
"""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import quote

from ci import ci_api

INFRA_SIGNALS = {"agent_lost", "agent_stop", "agent_refused", "agent_incompatible", "cancel", "process_run_error",
                 "stack_error"}
STATES = {"passed", "failed", "timed_out", "canceled", "broken", "skipped", "running"}
GITHUB_STATES = {"success": "passed", "failure": "failed", "timed_out": "timed_out", "cancelled": "canceled",
                 "skipped": "skipped", "neutral": "passed", "action_required": "broken", "stale": "canceled",
                 None: "running"}


SHARD_NAME = re.compile(r"^(.*) \(shard (\d+)/(\d+)\)$")


def shard_label(label: str, shard: tuple[int, int]) -> str:
    return f"{label} (shard {shard[0]}/{shard[1]})"


class HistoryError(Exception):
    pass


@dataclass
class LaneResult:
    state: str
    exit_status: int | None = None
    soft_failed: bool = False
    retried: bool = False
    signal_reason: str | None = None
    shard: int | None = None   # which shard of a sharded lane (1-based); None for a lane run whole

    @property
    def verdict(self) -> str:
        """green, red, infra (neither counts) or none (no verdict: skipped, running)."""
        if self.state == "passed" or self.soft_failed:
            return "green"
        if self.state in ("skipped", "running"):
            return "none"
        if self.state == "canceled" or self.signal_reason in INFRA_SIGNALS:
            return "infra"
        if self.state == "timed_out":
            return "red"
        if self.exit_status == -1 and self.signal_reason in (None, "none"):
            return "infra"   # a -1 with no timeout state: the agent went away
        return "red"


@dataclass
class Build:
    number: int
    commit: str
    branch: str
    url: str = ""
    finished_at: str | None = None
    lanes: dict[str, list[LaneResult]] = field(default_factory=dict)   # one entry per attempt

    def results(self, lane) -> list[LaneResult]:
        return self.lanes.get(lane.key, []) + self.lanes.get(lane.label, [])

    def verdict(self, lane) -> tuple[str, bool]:
        """The lane's one result in this build, however many shards and attempts it ran as, and whether a
        shard both failed and passed in it (a retry that flipped: flaky).

        Per shard the last green or red attempt counts (a retry after a lost agent replaces it).  The lane
        is red if any shard is red, else infra if any shard is infra, else green if any shard ran, else
        none: a lane is infrastructure only when every shard that is not green is.
        """
        last: dict[int | None, str] = {}
        seen: dict[int | None, set] = {}
        for r in self.results(lane):
            v = r.verdict
            if v in ("green", "red"):
                seen.setdefault(r.shard, set()).add(v)
            if v in ("green", "red") or last.get(r.shard, "none") == "none":
                last[r.shard] = v
        flaky = any(vs == {"green", "red"} for vs in seen.values())
        for v in ("red", "infra", "green"):
            if v in last.values():
                return v, flaky
        return "none", flaky


def _result(data, where: str) -> LaneResult:
    if not isinstance(data, dict):
        raise HistoryError(f"{where}: expected an object with at least 'state'")
    unknown = set(data) - {"state", "exit_status", "soft_failed", "retried", "signal_reason", "shard"}
    if unknown:
        raise HistoryError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    state = data.get("state")
    if state not in STATES:
        raise HistoryError(f"{where}.state: expected one of {', '.join(sorted(STATES))}, got {state!r}")
    exit_status = data.get("exit_status")
    if exit_status is not None and not isinstance(exit_status, int):
        raise HistoryError(f"{where}.exit_status: expected an integer or null, got {exit_status!r}")
    for flag in ("soft_failed", "retried"):
        if not isinstance(data.get(flag, False), bool):
            raise HistoryError(f"{where}.{flag}: expected true or false")
    shard = data.get("shard")
    if shard is not None and (not isinstance(shard, int) or isinstance(shard, bool) or shard < 1):
        raise HistoryError(f"{where}.shard: expected a shard number from 1, or null, got {shard!r}")
    return LaneResult(state, exit_status, data.get("soft_failed", False), data.get("retried", False),
                      data.get("signal_reason"), shard)


def load_file(path: str | Path) -> list[Build]:
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise HistoryError(f"{path}: history file not found") from None
    except json.JSONDecodeError as e:
        raise HistoryError(f"{path}:{e.lineno}:{e.colno}: not valid JSON ({e.msg})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("builds"), list):
        raise HistoryError(f"{path}: expected an object with a 'builds' list")
    builds = []
    for i, b in enumerate(doc["builds"]):
        where = f"{path}: builds[{i}]"
        if not isinstance(b, dict):
            raise HistoryError(f"{where}: expected an object")
        for key, kind in (("number", int), ("commit", str), ("branch", str)):
            if not isinstance(b.get(key), kind):
                raise HistoryError(f"{where}.{key}: expected {'an integer' if kind is int else 'a string'}")
        lanes = {}
        for name, res in (b.get("lanes") or {}).items():
            attempts = res if isinstance(res, list) else [res]
            lanes[name] = [_result(r, f"{where}.lanes[{name!r}]") for r in attempts]
        builds.append(Build(b["number"], b["commit"], b["branch"], b.get("url", ""), b.get("finished_at"), lanes))
    return builds


def dump_file(builds: list[Build], path: str | Path) -> None:
    out = []
    for b in builds:
        d = asdict(b)
        d["lanes"] = {k: [asdict(r) for r in v] if len(v) > 1 else asdict(v[0]) for k, v in b.lanes.items()}
        out.append(d)
    Path(path).write_text(json.dumps({"builds": out}, indent=2) + "\n")


def from_buildkite(slug: str, branch: str = "main") -> list[Build]:
    org, _, pipeline = slug.partition("/")
    if not org or not pipeline:
        raise HistoryError(f"--buildkite expects ORG/PIPELINE, got {slug!r}")
    root = ci_api._root("buildkite")
    url = f"{root}/organizations/{quote(org)}/pipelines/{quote(pipeline)}/builds?branch={quote(branch)}"
    builds = []
    for b in ci_api.paged("buildkite", url, pages=3):
        lanes: dict[str, list[LaneResult]] = {}
        for job in b.get("jobs", []):
            if job.get("type", "script") != "script" or not job.get("name"):
                continue
            attempts = lanes.setdefault(job["name"], [])
            index = job.get("parallel_group_index")   # a sharded lane's jobs share its name
            attempts.append(LaneResult(job.get("state", "failed"), job.get("exit_status"),
                                       bool(job.get("soft_failed")), bool(job.get("retried")),
                                       job.get("signal_reason"), index + 1 if isinstance(index, int) else None))
        builds.append(Build(b["number"], b["commit"], b.get("branch", branch), b.get("web_url", ""),
                            b.get("finished_at"), lanes))
    return builds


def from_github(repo: str, workflow: str, branch: str = "main") -> list[Build]:
    if repo.count("/") != 1:
        raise HistoryError(f"--github expects OWNER/REPO, got {repo!r}")
    root = ci_api._root("github")
    runs = ci_api.paged("github", f"{root}/repos/{repo}/actions/workflows/{quote(workflow)}/runs"
                                  f"?branch={quote(branch)}", key="workflow_runs", pages=1)
    builds = []
    for run in runs:
        jobs = ci_api.paged("github", f"{root}/repos/{repo}/actions/runs/{run['id']}/jobs?filter=all", key="jobs")
        lanes: dict[str, list[LaneResult]] = {}
        for job in jobs:
            name, shard = job["name"], None
            sharded = SHARD_NAME.match(name)   # the lanes workflow names a shard's job "LABEL (shard K/N)"
            if sharded:
                name, shard = sharded.group(1), int(sharded.group(2))
            lanes.setdefault(name, []).append(
                LaneResult(GITHUB_STATES.get(job.get("conclusion"), "failed"), retried=job.get("run_attempt", 1) > 1,
                           shard=shard))
        builds.append(Build(run["run_number"], run["head_sha"], run.get("head_branch", branch), run.get("html_url", ""),
                            run.get("updated_at"), lanes))
    return builds
