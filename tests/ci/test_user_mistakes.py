"""Every user mistake, across the commands, ends in exit 2 and one line on stderr that names what was
wrong, with the nearest valid choice where there is one; never a traceback, and nothing started.

Each runs in this process, through the same `main` the `lanekeeper` program calls (an exception that
escaped it would fail the test with its traceback); a few also run as the program itself."""
import os
import subprocess
import sys

import pytest

from ci.run import record
from tests.helpers.repo import ROOT, git

# (command line, what the line must name, the suggestion it must carry or None).  {t} is a scratch
# directory holding: nodir/ absent, a.txt (not JUnit, not JSON), bad.json, a clean git repository repo/,
# and mixed/ (one lane's results from two runs).
MISTAKES = [
    ("run tts-bse --dry-run", "tts-bse", "tts-base"),
    ("run config --shard 3/2 --dry-run", "3/2", None),
    ("run config --artifacts {t}/a.txt", "a.txt", None),
    ("run config --lanes-file {t}/nodir/lanes.yaml --dry-run", "lanes.yaml", None),
    ("synth hi -o {t}/nodir/x.wav", "nodir", None),
    ("synth hi -o {t}/x.mp3", ".mp3", None),
    ("synth hi -o {t}/x.wav --platform cuda", "cuda", None),
    ("synth hi -o {t}/x.wav --set stages.0.max_num_seq=8", "stages.0.max_num_seq", "max_num_seqs"),
    ("synth hi -o {t}/x.wav --ref-audio {t}/a.txt", "a.txt", None),
    ("serve --port 70000", "70000", None),
    ("serve --platform cuda", "cuda", None),
    ("serve --allowed-local-media-path {t}/nodir", "nodir", None),
    ("serve --profile qwen3_ts", "qwen3_ts", "qwen3_tts"),
    ("profile show qwen3_tts --set modle.preset=tiny", "modle", "model"),
    ("profile show qwen3_tts --set stages.1.max_num_seqs=8", "stages.1.max_num_seqs", "input_connector"),
    ("profile show qwen3_tts --platform tpu", "tpu", None),
    ("profile pin qwen3_ttss", "qwen3_ttss", "qwen3_tts"),
    ("profile show qwen3_tts -- -x", "--", None),
    ("pipeline buildkite", "--event", None),
    ("pipeline buildkite --event push --changed-files {t}/nodir/files.txt", "files.txt", None),
    ("pipeline github-lanes --event push --changed-since no-such-ref", "no-such-ref", None),
    ("rollback --lane tts-base --history {t}/bad.json --keys model_runer --repo {t}/repo", "model_runer",
     "model_runner"),
    ("rollback --lane tts-bse --history {t}/bad.json --repo {t}/repo", "tts-bse", "tts-base"),
    ("rollback --lane tts-base --history {t}/bad.json --repo {t}/repo", "bad.json", None),
    ("rollback --lane tts-base --history {t}/bad.json --repo {t}/nodir", "nodir", None),
    ("history add {t}/h.json --lane tts-base --junit {t}/nodir/junit.xml --commit abc", "junit.xml", None),
    ("history add {t}/bad.json --lane tts-base --junit {t}/mixed/one/junit.xml --commit abc", "bad.json", None),
    ("history add {t}/h.json --lane tts-bse --junit {t}/mixed/one/junit.xml --commit abc", "tts-bse", "tts-base"),
    ("report --junit {t}/a.txt", "a.txt", None),
    ("report --junit {t}/nodir/junit.xml", "junit.xml", None),
    ("report --junit {t}/mixed", "mixed", None),
    ("report --junit {t}/mixed/one/junit.xml --format html", "html", None),
]


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    t = tmp_path_factory.mktemp("mistakes")
    (t / "a.txt").write_text("neither JUnit nor JSON nor audio\n")
    (t / "bad.json").write_text('{"builds": [{"number": "one"}]}\n')
    (t / "repo").mkdir()
    git(t / "repo", "init", "-q")
    git(t / "repo", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "empty", "--allow-empty")
    for name, run_id in (("one", "a"), ("two", "b")):
        d = t / "mixed" / name
        d.mkdir(parents=True)
        (d / "junit.xml").write_text('<testsuites><testsuite name="tts-base">'
                                     f'<testcase classname="tests.t" name="test_{name}"/></testsuite></testsuites>')
        record.write(d, record.RunRecord(run_id=run_id, lane="tts-base"))
    return t


def _check(code, err, names, suggests, scratch):
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert "Traceback" not in err
    assert names in lines[0], lines[0]
    if suggests:
        assert suggests in lines[0], lines[0]
    assert not (scratch / "x.wav").exists() and not (scratch / "x.mp3").exists()


@pytest.fixture
def clean_env(monkeypatch):
    for name in ("BUILDKITE", "GITHUB_ACTIONS", "LANEKEEPER_ROOT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(ROOT)


@pytest.mark.parametrize("line,names,suggests", MISTAKES, ids=[m[0].replace("{t}/", "") for m in MISTAKES])
def test_a_mistake_is_one_line_and_exit_2(scratch, clean_env, capsys, line, names, suggests):
    from ci.cli import main

    args = [a.replace("{t}", str(scratch)) for a in line.split()]
    try:
        code = main(args)
    except SystemExit as e:   # argparse's own usage errors
        code = e.code
    _check(code, capsys.readouterr().err, names, suggests, scratch)


@pytest.mark.parametrize("n", [0, 4, 10, 21, 28])
def test_as_the_program_too(scratch, clean_env, n):
    line, names, suggests = MISTAKES[n]
    env = {k: v for k, v in os.environ.items() if k not in ("BUILDKITE", "GITHUB_ACTIONS", "LANEKEEPER_ROOT")}
    args = [a.replace("{t}", str(scratch)) for a in line.split()]
    run = subprocess.run([sys.executable, "-m", "ci.cli", *args], cwd=ROOT, capture_output=True, text=True,
                         env=env, timeout=120)
    _check(run.returncode, run.stderr + ("Traceback" if "Traceback" in run.stdout else ""), names, suggests, scratch)
