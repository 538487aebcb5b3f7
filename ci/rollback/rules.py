"""`decide`: the lane's history, read by a sequence of small rules.

Each rule looks at what the rules before it established (a `Case`) and either adds to it or ends
the decision with a `Decision`: a reason code and its facts.  The order is the order of the
questions: is there a real red at all, is it confirmed, which commit caused it, may it be rolled
back, has it been already.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ci.git import existing_ref, git
from ci.lanes.schema import Lane
from ci.rollback.repo import PINS, TRAILER, check_commits, left_over, recorded, branch_name, chain_files, \
    resolved_at
from ci.rollback.decision import Decision, Reason, infra_note, isolation_lines
from ci.rollback.history import Build
from engine.profile.document import MISSING, diff


@dataclass
class Case:
    builds: list[Build]
    lane: Lane
    repo: Path
    min_red: int = 2
    keys: list[str] | None = None
    audit: object = None
    remote: str | None = None
    pr_for: Callable[[str], dict | None] | None = None
    isolate_budget: float | None = None                        # seconds; None: no isolation
    candidates: list[tuple[str, dict]] = field(default_factory=list)   # (commit, keys it changed)
    seq: list[tuple[Build, str]] = field(default_factory=list)   # real results: (build, green|red)
    infra: list[Build] = field(default_factory=list)
    flaky: list[str] = field(default_factory=list)
    message: str = ""                                          # the culprit's commit message
    d: Decision = field(default_factory=lambda: Decision(Reason.CONFIRMED))   # what is known so far

    def end(self, code: Reason, **facts) -> Decision:
        self.d.code, self.d.facts = code, {"lane": self.lane.key, "profile": self.lane.profile, **facts}
        return self.d


def results(c: Case):
    """One verdict a build (however many shards and attempts); infrastructure set aside."""
    by_commit: dict[str, set] = {}
    for b in sorted((b for b in c.builds if b.branch == "main"), key=lambda b: b.number):
        verdict, flipped = b.verdict(c.lane)
        if verdict in ("green", "red"):
            by_commit.setdefault(b.commit, set()).update({"green", "red"} if flipped else {verdict})
            c.seq.append((b, verdict))
        elif verdict == "infra":
            c.infra.append(b)
    c.flaky = [commit for commit, vs in by_commit.items() if vs == {"green", "red"}]
    if not c.seq:
        return c.end(Reason.ONLY_INFRA, infra=[b.number for b in c.infra]) if c.infra else c.end(Reason.NO_RESULTS)


def flaky(c: Case):
    if c.flaky:
        return c.end(Reason.FLAKY, commit=c.flaky[0][:12])


def still_red(c: Case):
    newest, verdict = c.seq[-1]
    if verdict == "green":
        later = [b for b in c.infra if b.number > newest.number]
        if later:
            return c.end(Reason.GREEN_AFTER_INFRA, infra=[b.number for b in later], build=newest.number)
        return c.end(Reason.GREEN_AGAIN, build=newest.number)


def streak(c: Case):
    """The last green and the reds after it, as evidence."""
    greens = [i for i, (_, v) in enumerate(c.seq) if v == "green"]
    if not greens:
        return c.end(Reason.NO_GREEN)
    d = c.d
    d.last_green, d.reds = c.seq[greens[-1]][0], [b for b, _ in c.seq[greens[-1] + 1:]]
    d.evidence = [f"last green: build #{d.last_green.number} at {d.last_green.commit[:12]} {d.last_green.url}".rstrip()]
    d.evidence += [f"red: build #{b.number} at {b.commit[:12]} {b.url}".rstrip() for b in d.reds]
    aside = [b for b in c.infra if b.number > d.last_green.number]
    if aside:
        d.evidence.append(infra_note([b.number for b in aside]))


def confirmed(c: Case):
    red_commits = len(dict.fromkeys(b.commit for b in c.d.reds))
    if red_commits < c.min_red:
        return c.end(Reason.NOT_CONFIRMED, red_commits=red_commits, min_red=c.min_red)


def culprit(c: Case):
    """The one commit in (last green, first red] that changed a default of the lane's profile."""
    d = c.d
    check_commits(c.repo, [d.last_green, *d.reds])
    commits = git(c.repo, "rev-list", "--reverse", f"{d.last_green.commit}..{d.reds[0].commit}").split()
    if not commits:
        return c.end(Reason.NO_COMMITS, last_green=d.last_green.commit[:12], first_red=d.reds[0].commit[:12])
    candidates = [(sha, changed) for sha in commits
                  if (changed := diff(resolved_at(c.repo, f"{sha}^", c.lane), resolved_at(c.repo, sha, c.lane)))]
    d.evidence.append(f"commits in (last green, first red]: {', '.join(sha[:12] for sha in commits)}")
    if not candidates:
        return c.end(Reason.NOT_A_FLIP)
    c.candidates = candidates
    if len(candidates) > 1:
        if c.isolate_budget is not None and not c.keys:   # isolation may still find the one
            return None
        return c.end(Reason.SEVERAL_CANDIDATES, count=len(candidates),
                     commits=", ".join(sha[:12] for sha, _ in candidates))
    return _blame(c, *candidates[0])


def _blame(c: Case, sha: str, changed: dict):
    d = c.d
    d.culprit = sha
    c.message = git(c.repo, "log", "-1", "--format=%B", d.culprit)
    d.evidence.append(f"culprit: {d.culprit[:12]} {_subject(c)!r} changed " +
                      ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in sorted(changed.items())))
    unknown = sorted(set(c.keys or ()) - set(changed))
    if unknown:
        return c.end(Reason.UNKNOWN_KEYS, unknown=", ".join(unknown), changed=", ".join(sorted(changed)))
    d.keys = {k: v for k, v in changed.items() if not c.keys or k in c.keys}


def isolate(c: Case):
    """With isolation on and more than one candidate (keys of the culprit, or commits), verify which one."""
    from ci.rollback import isolate as isolation

    d, several = c.d, len(c.candidates) > 1
    if c.isolate_budget is None or c.keys or (not several and len(d.keys) < 2):
        return None
    if not several and existing_ref(c.repo, branch_name(c.repo, d.culprit), c.remote):
        return None   # a rollback of this culprit exists: its isolation chose the keys; this lane adds evidence
    if several:
        units = [isolation.Candidate(sha[:12], sha, frozenset(changed)) for sha, changed in c.candidates]
    else:
        units = [isolation.Candidate(key, d.culprit, frozenset({key})) for key in sorted(d.keys)]
    found = isolation.isolate(c.repo, c.lane, units, c.isolate_budget)
    d.isolation = found.record()
    fallback = None if found.chosen else ("commits" if several else "keys")
    d.evidence += isolation_lines(d.isolation, c.isolate_budget, fallback)
    if found.chosen is None and several:
        return c.end(Reason.SEVERAL_CANDIDATES, count=len(c.candidates),
                     commits=", ".join(sha[:12] for sha, _ in c.candidates))
    if found.chosen is not None and several:
        return _blame(c, found.chosen.commit, dict(c.candidates)[found.chosen.commit])
    if found.chosen is not None:
        d.keys = {k: v for k, v in d.keys.items() if k in found.chosen.keys}
    return None


def scope(c: Case):
    """What a rollback would restore and what it would leave, and the branch it would go on."""
    d = c.d
    touched = git(c.repo, "diff-tree", "--no-commit-id", "--name-only", "-r", "--no-renames", d.culprit).split()
    chain = set(chain_files(c.repo, c.lane.profile))
    d.others = [t for t in touched if t != PINS and (t not in chain or left_over(c.repo, d.culprit, t, set(d.keys)))]
    d.branch = branch_name(c.repo, d.culprit)
    if "<invalid>" in d.keys:
        return c.end(Reason.UNRESOLVABLE)


def _subject(c: Case) -> str:
    return c.message.splitlines()[0] if c.message else ""


def allowed(c: Case):
    short = c.d.culprit[:12]
    if "NOAUTOREVERT" in c.message:
        return c.end(Reason.NOAUTOREVERT, culprit=short)
    if f"{TRAILER}:" in c.message or _subject(c).startswith(("Revert", "Roll back", "Rollback")) \
            or "This reverts commit" in c.message:
        return c.end(Reason.CULPRIT_IS_ROLLBACK, culprit=short)


def not_restored(c: Case):
    head = resolved_at(c.repo, "HEAD", c.lane)
    if all(head.get(k, MISSING) == before for k, (before, _) in c.d.keys.items()):
        return c.end(Reason.ALREADY_RESTORED, values=", ".join(f"{k}={a!r}" for k, (a, _) in c.d.keys.items()))


def not_done(c: Case):
    """One rollback per culprit: a second red lane adds its evidence to the first one's."""
    d = c.d
    d.existing = existing_ref(c.repo, d.branch, c.remote)
    d.pr = c.pr_for(d.branch) if c.pr_for else None
    if not (d.existing or d.pr):
        return None
    where = f"branch {d.branch}" + (f" (pull request {d.pr.get('html_url')})" if d.pr else "")
    done = d.existing and recorded(c.repo, d.existing, d.culprit, c.lane)
    return c.end(Reason.ALREADY_RECORDED if done else Reason.EVIDENCE, culprit=d.culprit[:12], where=where)


def under_cap(c: Case):
    if c.audit is not None and c.audit.recent_apply(c.lane.key):
        return c.end(Reason.DAILY_CAP)


RULES = (results, flaky, still_red, streak, confirmed, culprit, isolate, scope, allowed, not_restored, not_done, under_cap)


def decide(builds: list[Build], lane: Lane, repo: Path, min_red: int = 2, audit=None,
           keys: list[str] | None = None, remote: str | None = None,
           pr_for: Callable[[str], dict | None] | None = None, isolate_budget: float | None = None) -> Decision:
    """What to do about the lane's history: nothing (and why), a rollback, or evidence on an existing one.
    `audit` (ci.rollback.branch.Audit) caps rollbacks at one a lane a day; `pr_for(branch)` finds a
    branch's open pull request; `isolate_budget` (seconds) turns culprit isolation on (ci/rollback/isolate.py)."""
    case = Case(builds, lane, repo, min_red, keys, audit, remote, pr_for, isolate_budget)
    for rule in RULES:
        decision = rule(case)
        if decision is not None:
            return decision
    return case.end(Reason.CONFIRMED, culprit=case.d.culprit[:12], keys=", ".join(sorted(case.d.keys)))
