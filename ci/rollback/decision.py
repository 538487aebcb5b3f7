"""What `lanekeeper rollback` decided, as data: a reason code and the facts behind it.

Every sentence about a decision is rendered here, from its code and facts (`Decision.reason`); callers
and tests go by the code.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from ci.rollback.history import Build


class Reason(enum.Enum):
    NO_RESULTS = "no_results"                  # the lane has no result on main
    ONLY_INFRA = "only_infra"                  # only infrastructure results
    FLAKY = "flaky"                            # a commit with both a pass and a fail
    GREEN_AFTER_INFRA = "green_after_infra"    # the newest real result is green, later ones infrastructure
    GREEN_AGAIN = "green_again"                # the newest result is green
    NO_GREEN = "no_green"                      # nothing green to compare with
    NOT_CONFIRMED = "not_confirmed"            # too few red commits after the last green
    NO_COMMITS = "no_commits"                  # git has nothing between the last green and the first red
    NOT_A_FLIP = "not_a_flip"                  # no commit in the range changed the profile's defaults
    SEVERAL_CANDIDATES = "several_candidates"  # more than one commit changed them
    UNKNOWN_KEYS = "unknown_keys"              # --keys names a default the culprit did not change
    UNRESOLVABLE = "unresolvable"              # the profile did not resolve on one side of the culprit
    NOAUTOREVERT = "noautorevert"              # the culprit asks not to be rolled back
    CULPRIT_IS_ROLLBACK = "culprit_is_rollback"  # never roll back a rollback or a revert
    ALREADY_RESTORED = "already_restored"      # main already has the old values
    ALREADY_RECORDED = "already_recorded"      # a rollback exists and records this lane's red
    EVIDENCE = "evidence"                      # a rollback exists: add this lane's red to it
    DAILY_CAP = "daily_cap"                    # this lane had a rollback in the last 24 h
    CONFIRMED = "confirmed"                    # roll back


ACTIONS = {Reason.EVIDENCE: "evidence", Reason.CONFIRMED: "rollback"}   # every other code: "none"

MESSAGES = {
    Reason.NO_RESULTS: "no results for lane {lane} on main",
    Reason.ONLY_INFRA: "{infra_note}, and no other result; nothing red to act on",
    Reason.FLAKY: "flaky: commit {commit} has both a pass and a fail for {lane}; not acting",
    Reason.GREEN_AFTER_INFRA: "{infra_note}; the last real result, build #{build}, is green; nothing red to act on",
    Reason.GREEN_AGAIN: "lane {lane} is green again at build #{build}; nothing to do",
    Reason.NO_GREEN: "lane {lane} has no green build to compare with",
    Reason.NOT_CONFIRMED: "only {red_commits} red build(s) on distinct commits after the last green (need {min_red}); "
                          "not confirmed",
    Reason.NO_COMMITS: "git has no commits between {last_green} and {first_red}",
    Reason.NOT_A_FLIP: "the red streak started at a commit that changed no default of {profile}; not a profile default "
                       "flip, reporting only",
    Reason.SEVERAL_CANDIDATES: "{count} candidate commits changed {profile}: {commits}; reporting only",
    Reason.UNKNOWN_KEYS: "--keys {unknown}: not a default the culprit changed (it changed {changed}); not acting",
    Reason.UNRESOLVABLE: "the profile did not resolve on one side of the culprit; reporting only",
    Reason.NOAUTOREVERT: "culprit {culprit} says NOAUTOREVERT; not acting",
    Reason.CULPRIT_IS_ROLLBACK: "culprit {culprit} is itself a rollback or revert; never rolling back a rollback",
    Reason.ALREADY_RESTORED: "the default is already restored on main ({values})",
    Reason.ALREADY_RECORDED: "a rollback of {culprit} already exists on {where} and records lane {lane}'s red",
    Reason.EVIDENCE: "a rollback of {culprit} already exists on {where}; adding lane {lane}'s red to it",
    Reason.DAILY_CAP: "lane {lane} already had a rollback in the last 24 h; at most one a day",
    Reason.CONFIRMED: "confirmed: {culprit} flipped {keys} of {profile}",
}


# What isolation found (ci/rollback/isolate.py), by its outcome; then what the rollback does about it.
ISOLATION = {
    "isolated": "isolation: reverting {chosen} alone turned the failing tests green; rolling back only that",
    "not_reproduced": "isolation: the lane is green here at the unchanged tip, so the red does not reproduce on this "
                      "machine and isolation cannot tell",
    "none_green": "isolation: no candidate turned the failing tests green alone",
    "several_green": "isolation: {green} each turned the failing tests green alone",
    "over_budget": "isolation: its budget of {budget:.0f}s ran out after {runs} run(s)",
    "cannot_run": "isolation: {why}; not guessing",
}
FALLBACK = {"keys": "falling back to restoring every key the culprit changed",
            "commits": "falling back to reporting only"}


def isolation_lines(record: dict, budget: float, fallback: str | None) -> list[str]:
    """The isolation's outcome and each run, in words, for the evidence, the commit and the pull request."""
    head = ISOLATION[record["outcome"]].format(chosen=record["chosen"], green=", ".join(record["green"]),
                                               budget=budget, runs=len(record["trials"]), why=record["why"])
    lines = [head + (f"; {FALLBACK[fallback]}" if fallback else "")]
    lines += [f"  {t['candidate']}: {t['outcome']} in {t['seconds']:g}s ({', '.join(t['tests']) or 'no tests'})"
              for t in record["trials"]]
    return lines


def infra_note(numbers: list[int]) -> str:
    return (f"{len(numbers)} build(s) set aside as infrastructure (lost agent / cancelled): "
            f"{', '.join(f'#{n}' for n in numbers)}")


@dataclass
class Decision:
    code: Reason
    facts: dict = field(default_factory=dict)      # what the message says, by name
    evidence: list[str] = field(default_factory=list)
    culprit: str | None = None
    keys: dict[str, tuple] = field(default_factory=dict)   # resolved key -> (parent value, culprit value)
    last_green: Build | None = None
    reds: list[Build] = field(default_factory=list)
    others: list[str] = field(default_factory=list)        # the culprit's files a rollback leaves as they are
    branch: str | None = None
    existing: str | None = None     # the ref that holds the existing rollback of this culprit, if any
    pr: dict | None = None          # its open pull request, if any
    isolation: dict | None = None   # what isolation ran and found (ci/rollback/isolate.Isolation.record)

    @property
    def action(self) -> str:
        """none | rollback | evidence (add this lane's red to an existing rollback)"""
        return ACTIONS.get(self.code, "none")

    @property
    def act(self) -> bool:
        return self.action != "none"

    @property
    def reason(self) -> str:
        facts = dict(self.facts)
        if "infra" in facts:   # the build numbers set aside
            facts["infra_note"] = infra_note(facts["infra"])
        return MESSAGES[self.code].format(**facts)
