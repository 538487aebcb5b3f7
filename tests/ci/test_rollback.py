"""Rollback of a profile default, on real git repositories built here.

The histories replay the motivating pull request: one commit makes runner v2 the default
together with a stage-0 prefill bound that an opt-in profile inherits, rewrites that opt-in
profile's header comment, re-pins, splits a config test and adds a docs page.  Profile
content is always addressed by path (ProfileDoc), never by line or comment text.
"""
import json
import subprocess
from pathlib import Path
from urllib.parse import unquote

import pytest
from ruamel.yaml import YAML

from ci.cli import main
from ci.rollback.repo import REVIEW
from ci.rollback.decision import MESSAGES, Reason
from ci.rollback.branch import Audit
from engine.profile import pins
from engine.profile.document import ProfileDoc
from tests.helpers.fake_ci import TOKEN
from tests.helpers.lanes import one_lane_file
from tests.helpers.repo import copy_project, git

PROFILE = "profiles/qwen3_tts.yaml"
MRV2 = "profiles/qwen3_tts_mrv2.yaml"
PINS = "profiles/pins.yaml"
BASE_LANE, CV_LANE = "TTS · Qwen3-TTS Base Test", "TTS · Qwen3-TTS CustomVoice Test"
LEGACY = {"model_runner": "v1", "stages.0.max_num_batched_tokens": 2048}
FLIP = {"model_runner": "v2", "stages.0.max_num_batched_tokens": 512}
DOCS = "docs/model-runner-v2.md"
SPLIT_FROM, SPLIT_TEST = "tests/config/test_profiles.py", "tests/config/test_default_runner.py"
SPLIT_TEST_TEXT = '''\
"""The default profile's runner on every platform, split out and read from the pins."""
import pytest

from engine.profile import pins
from engine.profile.resolve import resolve
from tests.helpers.repo import PROFILES_DIR
from engine.profile.schema import PLATFORMS

pytestmark = pytest.mark.config


@pytest.mark.parametrize("platform", PLATFORMS)
def test_default_runner_is_pinned(platform):
    _, pinned = pins.read(PROFILES_DIR)
    assert resolve("qwen3_tts", platform=platform).config.model_runner == pinned["qwen3_tts"][platform]["model_runner"]
'''


def set_values(repo, file, values: dict) -> None:
    doc = ProfileDoc.load(repo / file)
    for path, value in values.items():
        doc.set(path, value)
    doc.save()


def commit(repo, message, files: dict | None = None, repin=True) -> str:
    for path, text in (files or {}).items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    if repin:
        pins.write(repo / "profiles")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def split_out(source: str, test: str) -> str:
    """The test module without the function `test` (the pull request moves it to its own file)."""
    start = source.index(f"def {test}(")
    end = source.find("\n\n\ndef ", start)
    return source[:start] + (source[end + 3:] if end != -1 else "")


# A defect of runner v2 the profile carries (a fault that acts only where the profile resolves to v2), and
# a short handoff deadline so that the stall it causes turns a test red in seconds.
V2_DEFECT = {"faults": ["drop_handoff:after_frames=2,when=model_runner:v2"], "watchdog.handoff_deadline_s": 2.0}
BOTH_DEFECT = {"faults": ["drop_handoff:after_frames=2,when=model_runner:v2,when=stages.0.max_num_batched_tokens:512"],
               "watchdog.handoff_deadline_s": 2.0}


def make_repo(tmp_path, flip_message="Make model runner v2 the default", after=("notes", "more notes"),
              pull_request=True, defect=None, split_flip=False):
    """A copy of the project on the legacy default (carrying `defect`), then the flip (as two commits with
    `split_flip`: runner, then the prefill bound), then unrelated commits."""
    repo = tmp_path / "repo"
    copy_project(repo)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.name", "Dev")
    git(repo, "config", "user.email", "dev@example.com")
    set_values(repo, PROFILE, {**LEGACY, **(defect or {})})
    shas = {"base": commit(repo, "Initial")}
    if split_flip:
        set_values(repo, PROFILE, {"model_runner": "v2"})
        shas["runner"] = commit(repo, flip_message)
        set_values(repo, PROFILE, {"stages.0.max_num_batched_tokens": 512})
        shas["flip"] = commit(repo, "Lower the stage-0 prefill bound")
    else:
        set_values(repo, PROFILE, FLIP)
        extra = {}
        if pull_request:
            extra = {MRV2: "# Opt-in MRV2: the default runs v2 now too; this keeps v2 if the default moves back.\n"
                           + (repo / MRV2).read_text(),
                     SPLIT_FROM: split_out((repo / SPLIT_FROM).read_text(), "test_default_profile_runner_per_platform"),
                     SPLIT_TEST: SPLIT_TEST_TEXT,
                     DOCS: "# Model runner V2\n\nV2 is now the default runner of the TTS profile.\n"}
        shas["flip"] = commit(repo, flip_message, extra)
    for i, text in enumerate(after):
        shas[f"after{i}"] = commit(repo, f"Unrelated change {i}", {"NOTES": text})
    return repo, shas


def small_lanes(tmp_path):
    """The two merge-only lanes, each cut to its one as-shipped test, so that isolation runs in seconds."""
    path = tmp_path / "lanes.yaml"
    path.write_text("lanes:\n" + "".join(f"""\
  - key: {key}
    label: "{label}"
    trigger: merge_only
    paths: [tests/e2e/offline/{file}]
    markers: merge_only
    keyword: as_shipped
    timeout: 120
    budget: 600
""" for key, label, file in (("tts-base", BASE_LANE, "test_base.py"),
                             ("tts-customvoice", CV_LANE, "test_custom_voice.py"))))
    return path


def history(tmp_path, *builds, lanes=("tts-base",)):
    """builds: (commit, state) or (commit, [states...]) or (commit, dict); the same result for each lane."""
    out = []
    for n, (sha, result) in enumerate(builds, start=1):
        attempts = result if isinstance(result, list) else [result]
        runs = [a if isinstance(a, dict) else {"state": a, "exit_status": 0 if a == "passed" else 1}
                for a in attempts]
        out.append({"number": n, "commit": sha, "branch": "main", "url": f"https://ci.example/builds/{n}",
                    "lanes": {lane: runs if len(runs) > 1 else runs[0] for lane in lanes}})
    path = tmp_path / "history.json"
    path.write_text(json.dumps({"builds": out}))
    return path


def rollback(capsys, repo, hist, *extra, lane=BASE_LANE):
    code = main(["rollback", "--lane", lane, "--history", str(hist), "--repo", str(repo), *extra])
    return code, capsys.readouterr()


def resolved(repo, rev, name, key, platform="cpu"):
    """A resolved value of a profile as the commit `rev` has it."""
    from engine.profile.resolve import resolve

    tmp = repo.parent / f"at-{rev.replace('/', '_')}"
    if not tmp.exists():
        git(repo, "worktree", "add", "-q", "--detach", str(tmp), rev)
    return resolve(tmp / "profiles" / f"{name}.yaml", platform=platform).get(key)


def pinned(repo, rev, name, key, platform="cpu"):
    return YAML(typ="safe").load(git(repo, "show", f"{rev}:{PINS}"))[name][platform][key]


def red_history(tmp_path, s, lanes=("tts-base",)):
    return history(tmp_path, (s["base"], "passed"), (s["flip"], "failed"), (s["after0"], "failed"),
                   (s["after1"], "failed"), lanes=lanes)


def test_motivating_pull_request_is_rolled_back_once(tmp_path, capsys):
    """The flip of runner v2 with the prefill bound an opt-in profile inherits, where runner v2 really
    breaks the lane: isolation restores the runner alone and keeps the bound, for both profiles."""
    repo, s = make_repo(tmp_path, defect=V2_DEFECT)
    hist = red_history(tmp_path, s, lanes=("tts-base", "tts-customvoice"))
    lanes_file = small_lanes(tmp_path)
    head = git(repo, "rev-parse", "HEAD")
    code, out = rollback(capsys, repo, hist, "--apply", "--verify", "config", "--isolate",
                         "--lanes-file", str(lanes_file))
    assert code == 0, out.out + out.err
    branch = f"rollback/{git(repo, 'rev-parse', '--short=10', s['flip'])}"
    (entry,) = Audit(repo).entries()
    assert (entry["action"], entry["code"], entry["branch"]) == ("applied", Reason.CONFIRMED.value, branch)
    assert entry["culprit"] == s["flip"] and entry["builds"] == [2, 3, 4]
    assert "verified with config" in entry["verify"] and "passed" in entry["verify"]
    assert git(repo, "rev-parse", f"{branch}~1") == head and git(repo, "rev-parse", "HEAD") == head
    assert git(repo, "status", "--porcelain") == ""
    # the control and one run per key, each with its tests, outcome and seconds
    isolation = entry["isolation"]
    assert (isolation["outcome"], isolation["chosen"]) == ("isolated", "model_runner")
    runs = {t["candidate"]: t for t in isolation["trials"]}
    assert {k: t["outcome"] for k, t in runs.items()} == {
        "control": "red", "model_runner": "green", "stages.0.max_num_batched_tokens": "red"}
    for t in runs.values():
        assert [i.split("[")[0] for i in t["tests"]] == ["tests/e2e/offline/test_base.py::test_voice_clone_as_shipped"]
        assert t["seconds"] > 0

    # the runner alone goes back: the prefill bound stays, in the default profile and in the opt-in one
    assert sorted(git(repo, "diff", "--name-only", head, branch).split()) == [PINS, PROFILE]
    assert resolved(repo, branch, "qwen3_tts", "model_runner") == "v1"
    assert resolved(repo, branch, "qwen3_tts", "stages.0.max_num_batched_tokens") == 512
    assert git(repo, "show", f"{branch}:{MRV2}") == git(repo, "show", f"{s['flip']}:{MRV2}")
    assert resolved(repo, branch, "qwen3_tts_mrv2", "model_runner") == "v2"
    assert resolved(repo, branch, "qwen3_tts_mrv2", "stages.0.max_num_batched_tokens") == 512
    # pins regenerated for the default profile only; the opt-in profile's are as the tip has them
    assert pinned(repo, branch, "qwen3_tts", "model_runner") == "v1"
    for name in ("qwen3_tts", "qwen3_tts_mrv2"):
        assert pinned(repo, branch, name, "stages.0.max_num_batched_tokens") == 512, name
    assert YAML(typ="safe").load(git(repo, "show", f"{branch}:{PINS}"))["qwen3_tts_mrv2"] == \
        YAML(typ="safe").load(git(repo, "show", f"{head}:{PINS}"))["qwen3_tts_mrv2"]
    message = git(repo, "log", "-1", "--format=%B", branch)
    assert f"Rollback-Of: {s['flip']}" in message and "Rollback-Evidence: tts-base" in message and "#2" in message
    assert "model_runner 'v2' -> 'v1'" in message and "max_num_batched_tokens 512 -> 2048" not in message
    assert "control: red" in message and "model_runner: green" in message   # the isolation, in the commit

    # the culprit's other files stay, listed for review: the default profile too, which keeps the bound
    review = message.split(REVIEW)[1].split("\n\n")[0]
    assert sorted(l[2:] for l in review.strip().splitlines()) == sorted([DOCS, MRV2, PROFILE, SPLIT_FROM, SPLIT_TEST])
    for path in (DOCS, SPLIT_FROM, SPLIT_TEST):
        assert git(repo, "show", f"{branch}:{path}") == git(repo, "show", f"{s['flip']}:{path}")

    # the CustomVoice lane is red for the same culprit: its evidence joins the same branch, unisolated
    code, cv = rollback(capsys, repo, hist, "--apply", "--isolate", "--lanes-file", str(lanes_file), lane=CV_LANE)
    assert code == 0, cv.out + cv.err
    assert "evidence added" in cv.out and branch in cv.out
    assert git(repo, "branch", "--list", "rollback/*").split() == [branch]
    evidence = git(repo, "log", "-1", "--format=%B", branch)
    assert "Rollback-Evidence: tts-customvoice" in evidence and f"Rollback-Of: {s['flip']}" in evidence
    assert git(repo, "diff", "--name-only", f"{branch}~1", branch) == ""
    tip = git(repo, "rev-parse", branch)

    # reruns of either lane are no-ops
    for lane in (BASE_LANE, CV_LANE):
        code, again = rollback(capsys, repo, hist, "--apply", "--lanes-file", str(lanes_file), lane=lane)
        assert code == 0 and Audit(repo).entries()[-1]["code"] == Reason.ALREADY_RECORDED.value, again.out
    assert git(repo, "rev-parse", branch) == tip and git(repo, "branch", "--list", "rollback/*").split() == [branch]
    assert [a["action"] for a in Audit(repo).entries()] == ["applied", "evidence", "none", "none"]
    assert [a["code"] for a in Audit(repo).entries()] == [Reason.CONFIRMED.value, Reason.EVIDENCE.value,
                                                           Reason.ALREADY_RECORDED.value, Reason.ALREADY_RECORDED.value]


def test_isolation_rolls_back_only_the_guilty_of_two_commits(tmp_path, capsys):
    """Runner v2 and the prefill bound in two commits before the first red: only the runner's is reverted."""
    repo, s = make_repo(tmp_path, defect=V2_DEFECT, split_flip=True)
    hist = red_history(tmp_path, s)
    code, out = rollback(capsys, repo, hist, "--apply", "--verify", "none", "--isolate",
                         "--lanes-file", str(small_lanes(tmp_path)))
    assert code == 0, out.out + out.err
    (entry,) = Audit(repo).entries()
    assert (entry["code"], entry["culprit"], entry["isolation"]["outcome"]) == \
        (Reason.CONFIRMED.value, s["runner"], "isolated")
    assert {t["candidate"]: t["outcome"] for t in entry["isolation"]["trials"]} == {
        "control": "red", s["runner"][:12]: "green", s["flip"][:12]: "red"}
    branch = f"rollback/{git(repo, 'rev-parse', '--short=10', s['runner'])}"
    assert resolved(repo, branch, "qwen3_tts", "model_runner") == "v1"
    assert resolved(repo, branch, "qwen3_tts", "stages.0.max_num_batched_tokens") == 512


def test_isolation_falls_back_when_the_red_needs_both_keys(tmp_path, capsys):
    """A defect that needs runner v2 and the bound together: each reverted alone turns the lane green, so
    isolation cannot name one, and the rollback restores both and says so."""
    repo, s = make_repo(tmp_path, defect=BOTH_DEFECT)
    hist = red_history(tmp_path, s)
    code, out = rollback(capsys, repo, hist, "--apply", "--verify", "none", "--isolate",
                         "--lanes-file", str(small_lanes(tmp_path)))
    assert code == 0, out.out + out.err
    (entry,) = Audit(repo).entries()
    assert (entry["code"], entry["isolation"]["outcome"]) == (Reason.CONFIRMED.value, "several_green")
    assert sorted(entry["keys"]) == ["model_runner", "stages.0.max_num_batched_tokens"]
    assert "falling back" in out.out
    branch = f"rollback/{git(repo, 'rev-parse', '--short=10', s['flip'])}"
    for key, value in LEGACY.items():
        assert resolved(repo, branch, "qwen3_tts", key) == value


def test_keys_narrows_the_rollback(tmp_path, capsys):
    repo, s = make_repo(tmp_path)
    hist = red_history(tmp_path, s)
    code, out = rollback(capsys, repo, hist, "--apply", "--verify", "config", "--keys", "model_runner")
    assert code == 0, out.out + out.err
    branch = f"rollback/{git(repo, 'rev-parse', '--short=10', s['flip'])}"
    assert resolved(repo, branch, "qwen3_tts", "model_runner") == "v1"
    assert resolved(repo, branch, "qwen3_tts", "stages.0.max_num_batched_tokens") == 512
    assert pinned(repo, branch, "qwen3_tts", "model_runner") == "v1"
    message = git(repo, "log", "-1", "--format=%B", branch)
    assert "regenerated for qwen3_tts\n" in message and "regenerated for qwen3_tts_mrv2" not in message
    assert f"- {PROFILE}\n" in message.split(REVIEW)[1]    # the prefill bound the culprit set is still there
    code, out = rollback(capsys, repo, hist, "--keys", "stages.0.max_num_seqs")
    assert Audit(repo).entries()[-1]["code"] == Reason.UNKNOWN_KEYS.value


def test_dry_run_changes_nothing(tmp_path, capsys):
    repo, s = make_repo(tmp_path)
    hist = red_history(tmp_path, s)
    code, out = rollback(capsys, repo, hist)
    assert code == 0 and Audit(repo).entries()[-1]["action"] == "dry_run"
    assert Audit(repo).entries()[-1]["code"] == Reason.CONFIRMED.value
    assert DOCS in out.out                      # what a rollback would leave for review is said up front
    assert git(repo, "branch", "--list", "rollback/*") == ""


def test_infrastructure_failures_neither_count_nor_break(tmp_path, capsys):
    repo, s = make_repo(tmp_path)
    lost = {"state": "failed", "exit_status": -1, "signal_reason": "agent_lost"}
    hist = history(tmp_path, (s["base"], "passed"), (s["flip"], "failed"), (s["after0"], lost),
                   (s["after1"], {"state": "timed_out", "exit_status": -1}))
    code, out = rollback(capsys, repo, hist)
    entry = Audit(repo).entries()[-1]
    assert code == 0 and entry["code"] == Reason.CONFIRMED.value
    assert entry["builds"] == [2, 4]      # the lost agent's build #3 neither counts nor breaks the streak


def test_infrastructure_only_reds_are_not_green_again(tmp_path, capsys):
    repo, s = make_repo(tmp_path)
    hist = history(tmp_path, (s["base"], "passed"),
                   (s["flip"], {"state": "failed", "exit_status": -1, "signal_reason": "agent_lost"}),
                   (s["after0"], {"state": "canceled", "exit_status": -1}),
                   (s["after1"], {"state": "failed", "exit_status": -1}))
    code, out = rollback(capsys, repo, hist, "--apply")
    assert code == 0
    entry = Audit(repo).entries()[-1]
    assert entry["code"] == Reason.GREEN_AFTER_INFRA.value and entry["facts"]["infra"] == [2, 3, 4]
    assert git(repo, "branch", "--list", "rollback/*") == ""


def test_commits_missing_from_a_shallow_clone(tmp_path, capsys):
    repo, s = make_repo(tmp_path)
    hist = red_history(tmp_path, s)
    shallow = tmp_path / "shallow"
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{repo}", str(shallow)], check=True)
    code, out = rollback(capsys, shallow, hist, "--apply")
    assert code == 2
    assert f"build #1's commit {s['base'][:12]} is not in --repo {shallow}" in out.err
    assert "shallow clone" in out.err and "git fetch --unshallow" in out.err
    assert "rev-list" not in out.err


def test_failed_verification_names_tests_and_pins_drift(tmp_path, capsys):
    """The culprit's split test asserts v2 literally, and a later commit left another profile's pins stale:
    the verification fails, and says which tests and which pins."""
    literal = SPLIT_TEST_TEXT.replace(
        'pinned["qwen3_tts"][platform]["model_runner"]',
        '("v2" if platform in ("cuda", "cpu") else "v1")').replace("test_default_runner_is_pinned",
                                                                    "test_default_runner_is_v2")
    repo, s = make_repo(tmp_path, after=())
    (repo / SPLIT_TEST).write_text(literal)
    s["after0"] = commit(repo, "Pin the runner in the test")
    set_values(repo, "profiles/qwen3_tts_high_concurrency.yaml", {"stages.0.max_num_seqs": 96})
    s["after1"] = commit(repo, "Raise the control's batch, pins forgotten", repin=False)
    hist = red_history(tmp_path, s)
    code, out = rollback(capsys, repo, hist, "--apply", "--verify", "config")
    assert code == 1, out.out + out.err
    assert "rollback not made: verification (config) failed" in out.out
    assert f"{SPLIT_TEST}::test_default_runner_is_v2[cpu]" in out.out
    assert "tests/config/test_profiles.py::test_pins_file_is_generated" in out.out
    drift = out.out.split("resolved vs pinned")[1]
    for name in ("qwen3_tts_high_concurrency", "qwen3_tts_high_concurrency_mrv2"):
        assert f"{name} stages.0.max_num_seqs (every platform): pinned 128, resolves to 96" in drift
    assert "Traceback" not in out.out
    assert git(repo, "branch", "--list", "rollback/*") == "" and git(repo, "worktree", "list").count("\n") == 0
    audit = Audit(repo).entries()
    assert audit[-1]["action"] == "verify_failed" and "test_default_runner_is_v2" in audit[-1]["detail"]


def test_remote_branch_and_open_pull_request(tmp_path, capsys, api, monkeypatch):
    """A rollback that lives on the remote and as an open pull request is found there: a second lane
    comments on that pull request and pushes its evidence to that branch; no second branch or PR."""
    base, routes = api
    monkeypatch.setenv("LANEKEEPER_GITHUB_API", base)
    monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
    monkeypatch.setenv("GITHUB_REPOSITORY", "acme/tts")
    pulls = []

    def list_or_open(query, payload):
        if payload is None:
            return [p for p in pulls if f"head=acme:{p['head']['ref']}" in unquote(query)]
        pulls.append({"number": 7, "html_url": "https://github.com/acme/tts/pull/7", "head": {"ref": payload["head"]}})
        return pulls[-1]

    routes["/repos/acme/tts/pulls"] = list_or_open
    routes["POST /repos/acme/tts/issues/7/comments"] = {"id": 1}
    repo, s = make_repo(tmp_path)
    remote = tmp_path / "remote.git"
    subprocess.run(["git", "init", "-q", "--bare", str(remote)], check=True)
    git(repo, "remote", "add", "origin", str(remote))
    git(repo, "push", "-q", "origin", "main")
    hist = red_history(tmp_path, s, lanes=("tts-base", "tts-customvoice"))
    gh = ["--push", "origin", "--open-pr"]
    code, out = rollback(capsys, repo, hist, "--apply", "--verify", "none", *gh)
    assert code == 0, out.out + out.err
    branch = f"rollback/{git(repo, 'rev-parse', '--short=10', s['flip'])}"
    assert f"pushed {branch} to origin" in out.out and "opened https://github.com/acme/tts/pull/7" in out.out
    (opened,) = [p for path, p in routes.posts if path == "/repos/acme/tts/pulls"]
    assert opened["head"] == branch and REVIEW in opened["body"] and DOCS in opened["body"]

    git(repo, "branch", "-D", branch)          # another machine: the rollback exists only on the remote
    code, out = rollback(capsys, repo, hist, "--apply", *gh, lane=CV_LANE)
    assert code == 0, out.out + out.err
    assert "evidence added" in out.out and "commented on https://github.com/acme/tts/pull/7" in out.out
    assert len([p for path, p in routes.posts if path == "/repos/acme/tts/pulls"]) == 1
    (comment,) = [p for path, p in routes.posts if path.endswith("/comments")]
    assert "tts-customvoice" in comment["body"]
    remote_log = git(remote, "log", "--format=%B", branch)
    assert "Rollback-Evidence: tts-customvoice" in remote_log and "Rollback-Evidence: tts-base" in remote_log
    assert git(remote, "branch", "--list", "rollback/*").split() == [branch]


@pytest.mark.parametrize("case", ["flaky", "one_red", "non_profile_start", "two_candidates", "noautorevert",
                                  "culprit_is_rollback", "green_again", "already_restored", "daily_limit",
                                  "no_results", "only_infra", "no_green", "no_commits", "unresolvable"])
def test_rails(case, tmp_path, capsys):
    flip_message = {"noautorevert": "Make v2 the default\n\nNOAUTOREVERT: we own this",
                    "culprit_is_rollback": "Roll back something\n\nRollback-Of: 0123456789abcdef"}.get(
                        case, "Make model runner v2 the default")
    repo, s = make_repo(tmp_path, flip_message)
    b, f, a0, a1 = s["base"], s["flip"], s["after0"], s["after1"]
    builds = [(b, "passed"), (f, "failed"), (a0, "failed"), (a1, "failed")]
    expect = {"flaky": Reason.FLAKY, "one_red": Reason.NOT_CONFIRMED, "non_profile_start": Reason.NOT_A_FLIP,
              "two_candidates": Reason.SEVERAL_CANDIDATES, "noautorevert": Reason.NOAUTOREVERT,
              "culprit_is_rollback": Reason.CULPRIT_IS_ROLLBACK, "green_again": Reason.GREEN_AGAIN,
              "already_restored": Reason.ALREADY_RESTORED, "daily_limit": Reason.DAILY_CAP,
              "no_results": Reason.NO_RESULTS, "only_infra": Reason.ONLY_INFRA, "no_green": Reason.NO_GREEN,
              "no_commits": Reason.NO_COMMITS, "unresolvable": Reason.UNRESOLVABLE}[case]
    lanes = ("tts-base",)
    if case == "flaky":
        builds[2] = (a0, ["failed", "passed"])
    elif case == "one_red":
        builds = builds[:2]
    elif case == "non_profile_start":
        builds = [(f, "passed"), (a0, "failed"), (a1, "failed")]
    elif case == "two_candidates":
        set_values(repo, PROFILE, {"async_chunk": False})
        c2 = commit(repo, "Turn async_chunk off")
        builds = [(b, "passed"), (c2, "failed"), (commit(repo, "x", {"NOTES": "x"}), "failed")]
    elif case == "green_again":
        builds.append((a1, "passed"))
        builds[3] = (a0, "failed")
    elif case == "already_restored":
        set_values(repo, PROFILE, LEGACY)
        commit(repo, "Back to v1 by hand")
    elif case == "daily_limit":
        Audit(repo).append({"lane": "tts-base", "action": "applied"})
    elif case == "no_results":
        lanes = ("tts-customvoice",)                  # another lane's results only
    elif case == "only_infra":
        builds = [(sha, {"state": "failed", "exit_status": -1, "signal_reason": "agent_lost"}) for sha, _ in builds]
    elif case == "no_green":
        builds = builds[1:]
    elif case == "no_commits":                        # the reds ran commits older than the green one
        builds = [(a1, "passed"), (f, "failed"), (a0, "failed")]
    elif case == "unresolvable":                      # a commit after the last green breaks the profile
        set_values(repo, PROFILE, {"model_runner": "v3"})
        broken = commit(repo, "Try runner v3", repin=False)
        builds = [(a1, "passed"), (broken, "failed"), (commit(repo, "x", {"NOTES": "y"}, repin=False), "failed")]
    hist = history(tmp_path, *builds, lanes=lanes)
    code, out = rollback(capsys, repo, hist, "--apply", "--verify", "none")
    assert code == 0, out.err
    assert Audit(repo).entries()[-1]["code"] == expect.value, out.out
    assert git(repo, "branch", "--list", "rollback/*") == ""


@pytest.mark.parametrize("problem", ["malformed_history", "bad_state", "unknown_lane", "missing_repo", "dirty",
                                     "min_red", "open_pr_without_repo"])
def test_bad_input_exits_2_and_changes_nothing(problem, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("GITHUB_REPOSITORY", raising=False)
    repo, s = make_repo(tmp_path)
    hist = history(tmp_path, (s["base"], "passed"), (s["flip"], "failed"), (s["after0"], "failed"))
    lane, repo_arg, extra = "tts-base", str(repo), []
    if problem == "malformed_history":
        hist.write_text('{"builds": [ {"number": 1,, }]}')
    elif problem == "bad_state":
        hist.write_text(json.dumps({"builds": [{"number": 1, "commit": "abc", "branch": "main",
                                                "lanes": {"tts-base": {"state": "exploded"}}}]}))
    elif problem == "unknown_lane":
        lane = "No such lane"
    elif problem == "missing_repo":
        repo_arg = str(tmp_path / "nowhere")
    elif problem == "dirty":
        (repo / PROFILE).write_text((repo / PROFILE).read_text() + "# local edit\n")
    elif problem == "min_red":
        extra = ["--min-red", "0"]
    elif problem == "open_pr_without_repo":
        extra = ["--open-pr"]
    before = (git(repo, "rev-parse", "HEAD"), git(repo, "status", "--porcelain"))
    if problem == "min_red":
        with pytest.raises(SystemExit) as exc:
            main(["rollback", "--lane", lane, "--history", str(hist), "--repo", repo_arg, "--apply", *extra])
        code = exc.value.code
    else:
        code = main(["rollback", "--lane", lane, "--history", str(hist), "--repo", repo_arg, "--apply", *extra])
    err = capsys.readouterr().err
    assert code == 2
    message = {"malformed_history": "history.json:1:", "bad_state": "builds[0].lanes['tts-base'][0].state",
               "unknown_lane": "unknown lane", "missing_repo": "repository not found",
               "dirty": "uncommitted changes", "min_red": "--min-red: must be at least 1",
               "open_pr_without_repo": "--open-pr needs --github OWNER/REPO"}[problem]
    assert message in err, err
    assert (git(repo, "rev-parse", "HEAD"), git(repo, "status", "--porcelain")) == before
    assert git(repo, "branch", "--list", "rollback/*") == ""


@pytest.mark.slow
def test_two_real_lane_runs_make_the_history(tmp_path, capsys):
    """Run a lane at the parent (green) and at the flip with a fault injected (red), record both,
    and let rollback restore the default from that history."""
    repo, s = make_repo(tmp_path, after=())
    lanes_file = one_lane_file(tmp_path, "tts-smoke", "as_shipped")
    hist = tmp_path / "history.json"
    import os
    import sys

    for number, (sha, faults) in enumerate([(s["base"], ""), (s["flip"], "drop_handoff:after_frames=2")], start=1):
        git(repo, "checkout", "-q", sha)
        art = tmp_path / f"art{number}"
        run = subprocess.run([sys.executable, "-m", "ci.cli", "run", "tts-smoke", "--lanes-file", str(lanes_file),
                              "--artifacts", str(art)], cwd=repo, capture_output=True, text=True, timeout=600,
                             env={**os.environ, "LANEKEEPER_FAULTS": faults})
        assert run.returncode == (0 if number == 1 else 1), run.stdout[-2000:]
        assert main(["history", "add", str(hist), "--lane", "tts-smoke", "--junit", str(art / "junit.xml"),
                     "--commit", sha, "--lanes-file", str(lanes_file)]) == 0
    git(repo, "checkout", "-q", "main")
    recorded = json.loads(hist.read_text())["builds"]
    assert [b["lanes"]["tts-smoke"]["state"] for b in recorded] == ["passed", "failed"]
    capsys.readouterr()
    code = main(["rollback", "--lane", "tts-smoke", "--history", str(hist), "--repo", str(repo), "--min-red", "1",
                 "--apply", "--verify", "config", "--lanes-file", str(lanes_file)])
    out = capsys.readouterr().out
    assert code == 0, out
    branch = f"rollback/{git(repo, 'rev-parse', '--short=10', s['flip'])}"
    assert git(repo, "show", f"{branch}:{PROFILE}") == git(repo, "show", f"{s['base']}:{PROFILE}")


def test_two_agents_racing_make_one_branch(tmp_path, capsys, monkeypatch):
    """Two lanes' jobs on two agents decide at once; the second to push turns its rollback into evidence."""
    from ci.rollback import rules as rb

    repo, s = make_repo(tmp_path)
    remote = tmp_path / "remote.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(repo), str(remote)], check=True)
    agents = []
    for name in ("a", "b"):
        subprocess.run(["git", "clone", "-q", str(remote), str(tmp_path / name)], check=True)
        git(tmp_path / name, "config", "user.name", "CI")
        git(tmp_path / name, "config", "user.email", "ci@example.com")
        agents.append(tmp_path / name)
    hist = red_history(tmp_path, s, lanes=("tts-base", "tts-customvoice"))
    code, out = rollback(capsys, agents[0], hist, "--apply", "--verify", "none", "--push", "origin")
    assert code == 0 and "pushed" in out.out, out.out + out.err
    monkeypatch.setattr(rb, "existing_ref", lambda *a: None)   # agent b decided before agent a pushed
    code, out = rollback(capsys, agents[1], hist, "--apply", "--verify", "none", "--push", "origin", lane=CV_LANE)
    assert code == 0, out.out + out.err
    assert "was pushed by another lane meanwhile: evidence" in out.out
    branch = f"rollback/{git(repo, 'rev-parse', '--short=10', s['flip'])}"
    log = git(remote, "log", "--format=%B", branch)
    assert log.count("Rollback-Evidence: tts-base") == 1 and log.count("Rollback-Evidence: tts-customvoice") == 1
    assert git(remote, "branch", "--list", "rollback/*").split() == [branch]
    # both agents' decisions are in the one audit log on the remote, which any later job reads
    audit = [(e["lane"], e["action"]) for e in Audit(agents[1], "origin").entries()]
    assert audit == [("tts-base", "applied"), ("tts-customvoice", "evidence")]
    third = tmp_path / "c"
    subprocess.run(["git", "clone", "-q", str(remote), str(third)], check=True)
    assert Audit(third, "origin").recent_apply("tts-base")      # the once-a-day cap holds on a fresh checkout


def test_history_files_of_earlier_versions_still_load(tmp_path):
    """Fields nothing reads any more are read past; any other unknown field is refused by name."""
    from ci.rollback import history

    path = tmp_path / "history.json"
    path.write_text(json.dumps({"builds": [{"number": 1, "commit": "abc", "branch": "main",
                                            "finished_at": "2026-12-01T00:00:00Z", "lanes": {
                                                "tts-base": {"state": "failed", "exit_status": 1, "retried": True}}}]}))
    (build,) = history.load_file(path)
    assert build.lanes["tts-base"][0].verdict == "red"
    history.dump_file([build], path)
    assert "retried" not in path.read_text() and "finished_at" not in path.read_text()
    assert history.load_file(path) == [build]
    path.write_text(json.dumps({"builds": [{"number": 1, "commit": "abc", "branch": "main",
                                            "lanes": {"tts-base": {"state": "failed", "colour": "red"}}}]}))
    with pytest.raises(history.HistoryError, match=r"builds\[0\]\.lanes\['tts-base'\]\[0\]\.colour: unknown field"):
        history.load_file(path)


def test_every_reason_code_renders_from_its_facts():
    """Messages are rendered in one place from a code and its facts; each code has one."""
    assert set(MESSAGES) == set(Reason)


def test_every_reason_code_has_a_test():
    """Each code is asserted by a test of this module (by its enum member)."""
    source = Path(__file__).read_text()
    assert [r.name for r in Reason if f"Reason.{r.name}" not in source] == []
