"""Tests speak of profile content by path, never by line or comment: a comment line added at the top
of every profile and every comment reworded leave the config and rollback tests green."""
import re
import subprocess
import sys

from tests.helpers.repo import copy_project, git


def reword(text: str) -> str:
    out = ["# A line added at the top: every line below moves down by one.\n"]
    for number, line in enumerate(text.splitlines(keepends=True), start=1):
        code, hash_, _ = line.partition("#")
        out.append(f"{code}# reworded comment {number}\n" if hash_ else line)
    return "".join(out)


def test_comments_and_line_numbers_do_not_matter(tmp_path):
    copy_project(tmp_path)
    profiles = sorted(p for p in (tmp_path / "profiles").glob("*.yaml") if p.name != "pins.yaml")
    assert len(profiles) >= 4
    for path in profiles:
        before = path.read_text()
        path.write_text(reword(before))
        assert path.read_text() != before and "reworded comment" in path.read_text()
    git(tmp_path, "init", "-q", "-b", "main")
    git(tmp_path, "add", "-A")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "reworded")
    # the rollback tests that run lanes (the motivating case, isolating a culprit, verifying) read the
    # profiles through the resolver tests/config holds to the reworded files, and edit them as the other
    # rollback tests here do: those stand for them (each is a minute or more of a 2-core suite)
    again = "not two_real_lane_runs and not isolation and not keys_narrows and not failed_verification " \
            "and not motivating"
    run = subprocess.run([sys.executable, "-m", "pytest", "tests/config", "tests/ci/test_rollback.py",
                          "-m", "not slow", "-k", again, "-q", "-p", "no:cacheprovider"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-4000:]
    last = run.stdout.strip().splitlines()[-1]     # pytest's own closing line
    assert re.match(r"\d+ passed", last) and "failed" not in last and "error" not in last, last
