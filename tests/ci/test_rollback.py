"""Rollback of a profile default, on real git repositories built here."""
import datetime as dt
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from ci.cli import main

ROOT = Path(__file__).resolve().parents[2]
PROFILE = "profiles/qwen3_tts.yaml"
V2_LINE = "model_runner: v2        # persistent batch + static KV buffers; pinned to v1 where v2 is unsupported"
V1_LINE = V2_LINE.replace("model_runner: v2", "model_runner: v1")


def git(repo, *args):
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout.strip()


def _pins_with(text: str, runner: str) -> str:
    """qwen3_tts's cpu and cuda pins set to `runner`."""
    out, section, platform = [], None, None
    for line in text.splitlines(keepends=True):
        if not line.startswith(" ") and line.strip().endswith(":"):
            section = line.strip()[:-1]
        elif line.startswith("  ") and not line.startswith("    "):
            platform = line.strip()[:-1]
        if section == "qwen3_tts" and platform in ("cpu", "cuda") and line.strip().startswith("model_runner:"):
            line = f"    model_runner: {runner}\n"
        out.append(line)
    return "".join(out)


def commit(repo, message, **files):
    for path, text in files.items():
        (repo / path.replace("__", "/")).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def make_repo(tmp_path, flip_message="Make model runner v2 the default", after=("notes", "more notes")):
    """A copy of the project whose default is v1, then the flip to v2, then unrelated commits."""
    repo = tmp_path / "repo"
    for rel in git(ROOT, "ls-files").splitlines():
        src = ROOT / rel
        if src.is_file():
            (repo / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, repo / rel)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.name", "Dev")
    git(repo, "config", "user.email", "dev@example.com")
    profile = (repo / PROFILE).read_text()
    pins = (repo / "profiles/pins.yaml").read_text()
    assert V2_LINE in profile
    shas = {"base": commit(repo, "Initial", **{"profiles__qwen3_tts.yaml": profile.replace(V2_LINE, V1_LINE),
                                                "profiles__pins.yaml": _pins_with(pins, "v1")})}
    shas["flip"] = commit(repo, flip_message, **{"profiles__qwen3_tts.yaml": profile, "profiles__pins.yaml": pins})
    for i, text in enumerate(after):
        shas[f"after{i}"] = commit(repo, f"Unrelated change {i}", NOTES=text)
    return repo, shas


def history(tmp_path, *builds):
    """builds: (commit, state) or (commit, [states...]) or (commit, dict)."""
    out = []
    for n, (sha, result) in enumerate(builds, start=1):
        attempts = result if isinstance(result, list) else [result]
        lanes = [a if isinstance(a, dict) else {"state": a, "exit_status": 0 if a == "passed" else 1}
                 for a in attempts]
        out.append({"number": n, "commit": sha, "branch": "main", "url": f"https://ci.example/builds/{n}",
                    "finished_at": f"2026-12-01T0{n}:00:00Z", "lanes": {"tts-base": lanes if len(lanes) > 1 else lanes[0]}})
    path = tmp_path / "history.json"
    path.write_text(json.dumps({"builds": out}))
    return path


def rollback(capsys, repo, hist, *extra):
    code = main(["rollback", "--lane", "TTS · Qwen3-TTS Base Test", "--history", str(hist), "--repo", str(repo),
                 *extra])
    return code, capsys.readouterr()


def test_flip_is_rolled_back_once(tmp_path, capsys):
    repo, s = make_repo(tmp_path)
    hist = history(tmp_path, (s["base"], "passed"), (s["flip"], "failed"), (s["after0"], "failed"),
                   (s["after1"], "failed"))
    head = git(repo, "rev-parse", "HEAD")
    code, out = rollback(capsys, repo, hist, "--apply", "--verify", "config")
    assert code == 0, out.out + out.err
    branch = f"rollback/tts-base/{git(repo, 'rev-parse', '--short=10', s['flip'])}"
    assert f"rolled back: branch {branch}" in out.out
    assert "last green: build #1" in out.out and "red: build #2" in out.out and "culprit:" in out.out
    assert "verified with config" in out.out and "passed" in out.out
    assert git(repo, "rev-parse", f"{branch}~1") == head and git(repo, "rev-parse", "HEAD") == head
    # the restored files are exactly the pre-flip ones: comments intact, pins back
    for path in (PROFILE, "profiles/pins.yaml"):
        assert git(repo, "show", f"{branch}:{path}") == git(repo, "show", f"{s['base']}:{path}"), path
    assert sorted(git(repo, "diff", "--name-only", head, branch).split()) == ["profiles/pins.yaml", PROFILE]
    message = git(repo, "log", "-1", "--format=%B", branch)
    assert f"Rollback-Of: {s['flip']}" in message and "tts-base" in message and "#2" in message
    assert "model_runner 'v2' -> 'v1'" in message
    assert git(repo, "status", "--porcelain") == ""
    # a second run does nothing, and says why
    code, again = rollback(capsys, repo, hist, "--apply")
    assert code == 0 and "no action: a rollback of" in again.out and "already exists" in again.out
    audit = [json.loads(l) for l in (repo / ".git/lanekeeper/rollback-audit.jsonl").read_text().splitlines()]
    assert [a["action"] for a in audit] == ["applied", "none"]


def test_dry_run_changes_nothing(tmp_path, capsys):
    repo, s = make_repo(tmp_path)
    hist = history(tmp_path, (s["base"], "passed"), (s["flip"], "failed"), (s["after0"], "failed"))
    code, out = rollback(capsys, repo, hist)
    assert code == 0 and "dry run" in out.out
    assert git(repo, "branch", "--list", "rollback/*") == ""


def test_infrastructure_failures_neither_count_nor_break(tmp_path, capsys):
    repo, s = make_repo(tmp_path)
    lost = {"state": "failed", "exit_status": -1, "signal_reason": "agent_lost"}
    hist = history(tmp_path, (s["base"], "passed"), (s["flip"], "failed"), (s["after0"], lost),
                   (s["after1"], {"state": "timed_out", "exit_status": -1}))
    code, out = rollback(capsys, repo, hist)
    assert code == 0 and "would roll back" in out.out


@pytest.mark.parametrize("case", ["flaky", "one_red", "non_profile_start", "two_candidates", "noautorevert",
                                  "culprit_is_rollback", "green_again", "already_restored", "daily_limit",
                                  "not_pure"])
def test_rails(case, tmp_path, capsys):
    flip_message = {"noautorevert": "Make v2 the default\n\nNOAUTOREVERT: we own this",
                    "culprit_is_rollback": "Roll back something\n\nRollback-Of: 0123456789abcdef"}.get(
                        case, "Make model runner v2 the default")
    repo, s = make_repo(tmp_path, flip_message)
    b, f, a0, a1 = s["base"], s["flip"], s["after0"], s["after1"]
    builds = [(b, "passed"), (f, "failed"), (a0, "failed"), (a1, "failed")]
    expect = {"flaky": "flaky", "one_red": "only 1 red build", "non_profile_start": "changed no default",
              "two_candidates": "2 candidate commits", "noautorevert": "NOAUTOREVERT",
              "culprit_is_rollback": "never rolling back a rollback", "green_again": "green again",
              "already_restored": "already restored on main", "daily_limit": "in the last 24 h",
              "not_pure": "not a pure default flip"}[case]
    if case == "flaky":
        builds[2] = (a0, ["failed", "passed"])
    elif case == "one_red":
        builds = builds[:2]
    elif case == "non_profile_start":
        builds = [(f, "passed"), (a0, "failed"), (a1, "failed")]
    elif case == "two_candidates":
        text = (repo / PROFILE).read_text().replace("async_chunk: true", "async_chunk: false")
        c2 = commit(repo, "Turn async_chunk off", **{"profiles__qwen3_tts.yaml": text})
        builds = [(b, "passed"), (c2, "failed"), (commit(repo, "x", NOTES="x"), "failed")]
    elif case == "green_again":
        builds.append((a1, "passed"))
        builds[3] = (a0, "failed")
    elif case == "already_restored":
        text = (repo / PROFILE).read_text().replace(V2_LINE, V1_LINE)
        commit(repo, "Back to v1 by hand", **{"profiles__qwen3_tts.yaml": text})
    elif case == "daily_limit":
        audit = repo / ".git/lanekeeper/rollback-audit.jsonl"
        audit.parent.mkdir(parents=True)
        audit.write_text(json.dumps({"at": dt.datetime.now(dt.timezone.utc).isoformat(), "lane": "tts-base",
                                     "action": "applied"}) + "\n")
    elif case == "not_pure":
        text = (repo / PROFILE).read_text().replace(V2_LINE, V1_LINE)
        git(repo, "reset", "-q", "--hard", b)
        f = commit(repo, "Flip and more", **{"profiles__qwen3_tts.yaml": text.replace(V1_LINE, V2_LINE),
                                             "NOTES": "also this"})
        builds = [(b, "passed"), (f, "failed"), (commit(repo, "y", NOTES="y"), "failed")]
    hist = history(tmp_path, *builds)
    code, out = rollback(capsys, repo, hist, "--apply", "--verify", "none")
    assert code == 0, out.err
    assert "no action:" in out.out and expect in out.out, out.out
    assert git(repo, "branch", "--list", "rollback/*") == ""


@pytest.mark.parametrize("problem", ["malformed_history", "bad_state", "unknown_lane", "missing_repo", "dirty"])
def test_bad_input_exits_2_and_changes_nothing(problem, tmp_path, capsys):
    repo, s = make_repo(tmp_path)
    hist = history(tmp_path, (s["base"], "passed"), (s["flip"], "failed"), (s["after0"], "failed"))
    lane, repo_arg = "tts-base", str(repo)
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
    before = (git(repo, "rev-parse", "HEAD"), git(repo, "status", "--porcelain"))
    code = main(["rollback", "--lane", lane, "--history", str(hist), "--repo", repo_arg, "--apply"])
    err = capsys.readouterr().err
    assert code == 2
    message = {"malformed_history": "history.json:1:", "bad_state": "builds[0].lanes['tts-base'].state",
               "unknown_lane": "unknown lane", "missing_repo": "repository not found",
               "dirty": "uncommitted changes"}[problem]
    assert message in err, err
    assert (git(repo, "rev-parse", "HEAD"), git(repo, "status", "--porcelain")) == before
    assert git(repo, "branch", "--list", "rollback/*") == ""


@pytest.mark.slow
def test_two_real_lane_runs_make_the_history(tmp_path, capsys):
    """Run a lane at the parent (green) and at the flip with a fault injected (red), record both,
    and let rollback restore the default from that history."""
    repo, s = make_repo(tmp_path, after=())
    lanes_file = tmp_path / "lanes.yaml"
    lanes_file.write_text("""\
lanes:
  - key: tts-smoke
    label: "TTS · smoke"
    trigger: merge_only
    paths: [tests/e2e/offline/test_custom_voice.py]
    markers: merge_only
    keyword: "text_to_audio and v2-cuda_graph-async_chunk"
    timeout: 120
    budget: 600
""")
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
    branch = f"rollback/tts-smoke/{git(repo, 'rev-parse', '--short=10', s['flip'])}"
    assert git(repo, "show", f"{branch}:{PROFILE}") == git(repo, "show", f"{s['base']}:{PROFILE}")
