"""Lane history: builds on main and how each lane did, from a file, Buildkite or GitHub.

A lane result is classified by state and signal reason, not by exit status alone:
Buildkite reports -1 both for a lost agent (infrastructure) and for a job killed at its
timeout (a real red, often a hang), and the latter has state `timed_out`.

History file format (JSON):

    {"builds": [
      {"number": 12, "commit": "<sha>", "branch": "main", "url": "https://...", "lanes": {
         "tts-base": {"state": "passed", "exit_status": 0, "soft_failed": false, "signal_reason": null,
                      "shard": null}}}]}

Lanes are keyed by lane key or label; a lane's value is its one result or a list of them (attempts,
shards).  `state` is one of passed, failed, timed_out, canceled, broken, skipped, running (GitHub
conclusions and Buildkite's other job states map onto these).  The models below validate the file.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import quote

from pydantic import ConfigDict, Field, TypeAdapter, ValidationError, field_validator
from pydantic.dataclasses import dataclass

from ci.run import ci_api
from engine.errors import UserError

INFRA_SIGNALS = {"agent_lost", "agent_stop", "agent_refused", "agent_incompatible", "cancel", "process_run_error",
                 "stack_error"}
State = Literal["passed", "failed", "timed_out", "canceled", "broken", "skipped", "running"]
GITHUB_STATES = {"success": "passed", "failure": "failed", "timed_out": "timed_out", "cancelled": "canceled",
                 "skipped": "skipped", "neutral": "passed", "action_required": "broken", "stale": "canceled",
                 None: "running"}
# Buildkite job states that are not (yet) a result: no verdict, as "skipped" and "running" have none.
BUILDKITE_STATES = {"canceling": "canceled", "expired": "canceled", "timing_out": "running",
                    **dict.fromkeys(("waiting_failed", "blocked_failed", "unblocked_failed", "not_run"), "skipped")}


SHARD_NAME = re.compile(r"^(.*) \(shard (\d+)/(\d+)\)$")


def shard_label(label: str, shard: tuple[int, int]) -> str:
    return f"{label} (shard {shard[0]}/{shard[1]})"


class HistoryError(UserError):
    pass


STRICT = ConfigDict(extra="forbid", strict=True)


@dataclass(config=STRICT)
class LaneResult:
    state: State
    exit_status: int | None = None
    soft_failed: bool = False
    signal_reason: str | None = None
    shard: int | None = Field(None, ge=1)   # which shard of a sharded lane (1-based); None for a lane run whole

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


@dataclass(config=STRICT)
class Build:
    """One CI build and how each lane did in it."""
    number: int
    commit: Annotated[str, Field(min_length=1)]
    branch: str
    url: str = ""
    lanes: dict[str, list[LaneResult]] = Field(default_factory=dict)   # one entry per attempt (and shard)

    @field_validator("lanes", mode="before")
    @classmethod
    def _one_or_many(cls, lanes):
        """A lane run once may be written as its one result instead of a list."""
        if isinstance(lanes, dict):
            return {k: v if isinstance(v, list) else [v] for k, v in lanes.items()}
        return lanes

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


@dataclass(config=STRICT)
class History:
    builds: list[Build]


HISTORY = TypeAdapter(History)


def _where(loc) -> str:
    """A pydantic error location as it reads in the file: builds[0].lanes['tts-base'][0].state."""
    out, parent = "", None
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif parent == "lanes":
            out += f"[{part!r}]"
        else:
            out += f".{part}" if out else part
        parent = part
    return out


def _drop_legacy(doc):
    """Fields that earlier versions wrote and nothing reads any more (a build's `finished_at`, a result's
    `retried`): read past, so that an existing history file still loads."""
    builds = doc.get("builds") if isinstance(doc, dict) else None
    for b in builds if isinstance(builds, list) else []:
        if not isinstance(b, dict):
            continue
        b.pop("finished_at", None)
        lanes = b.get("lanes")
        for results in lanes.values() if isinstance(lanes, dict) else []:
            for r in results if isinstance(results, list) else [results]:
                if isinstance(r, dict):
                    r.pop("retried", None)
    return doc


def load_file(path: str | Path) -> list[Build]:
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise HistoryError(f"{path}: history file not found") from None
    except json.JSONDecodeError as e:
        raise HistoryError(f"{path}:{e.lineno}:{e.colno}: not valid JSON ({e.msg})") from None
    try:
        # JSON mode: strict types, and objects for the dataclasses
        return HISTORY.validate_json(json.dumps(_drop_legacy(doc))).builds
    except ValidationError as e:
        err = e.errors()[0]
        where = _where(err["loc"])
        msg = "unknown field" if err["type"] == "unexpected_keyword_argument" else err["msg"]
        raise HistoryError(f"{path}: {where + ': ' if where else ''}{msg}"
                           + (f", got {err['input']!r}" if not isinstance(err["input"], (dict, list)) else "")) from None


def dump_file(builds: list[Build], path: str | Path) -> None:
    doc = HISTORY.dump_python(History(builds), mode="json")
    for b in doc["builds"]:
        b["lanes"] = {k: v[0] if len(v) == 1 else v for k, v in b["lanes"].items()}
    Path(path).write_text(json.dumps(doc, indent=2) + "\n")


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
            state = job.get("state", "failed")
            attempts.append(LaneResult(BUILDKITE_STATES.get(state, state if state in State.__args__ else "running"),
                                       job.get("exit_status"), bool(job.get("soft_failed")),
                                       job.get("signal_reason"), index + 1 if isinstance(index, int) else None))
        builds.append(Build(b["number"], b["commit"], b.get("branch", branch), b.get("web_url", ""), lanes))
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
            lanes.setdefault(name, []).append(LaneResult(GITHUB_STATES.get(job.get("conclusion"), "failed"),
                                                         shard=shard))
        builds.append(Build(run["run_number"], run["head_sha"], run.get("head_branch", branch), run.get("html_url", ""),
                            lanes))
    return builds
