"""The command line's basics: a version, help on every option, and quiet when its reader goes away."""
import argparse
import subprocess
import sys
from pathlib import Path

from ci.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[2]


def _options(parser, path):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _options(sub, path + [name])
        elif not isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            yield " ".join(path), "/".join(action.option_strings) or action.dest, action.help


def test_every_option_says_what_it_does():
    missing = [f"{cmd} {opt}" for cmd, opt, text in _options(build_parser(), ["lanekeeper"]) if not text]
    assert not missing, f"options without help text: {missing}"


def test_version(capsys):
    from importlib.metadata import version

    try:
        main(["--version"])
    except SystemExit as e:
        assert e.code == 0
    assert capsys.readouterr().out.strip() == f"lanekeeper {version('lanekeeper')}"


def test_a_reader_that_goes_away_gets_no_traceback():
    """`lanekeeper pipeline buildkite | head -1`: the reader closes before the write; no traceback."""
    cmd = [sys.executable, "-m", "ci.cli", "pipeline", "buildkite"]
    for _ in range(3):
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        proc.stdout.close()            # the reader is gone before anything is written
        err = proc.stderr.read().decode()
        proc.stderr.close()
        assert proc.wait(timeout=60) == 141 and "Traceback" not in err, err
