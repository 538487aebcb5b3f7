"""The plugin in a project that is not this one: loaded by its entry point, no conftest, only the
generic behaviours (hard timeouts, the summary); no matrix, no default timeout."""
import subprocess
import sys


def _run(project, *args):
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=project,
                          capture_output=True, text=True, timeout=120)


def test_a_foreign_project_gets_the_hard_timeout_and_the_summary(tmp_path):
    (tmp_path / "test_hang.py").write_text(
        "import time\nimport pytest\n\n\n@pytest.mark.timeout(2)\ndef test_hangs():\n    time.sleep(60)\n\n\n"
        "def test_fine():\n    pass\n")
    run = _run(tmp_path, "--junitxml", "junit.xml", "--lk-report-dir", "reports")
    assert run.returncode == 1, run.stdout + run.stderr
    summary = (tmp_path / "reports" / "matrix-summary.md").read_text()
    assert "1 passed" in summary and "1 stalled" in summary, summary
    assert "test_hangs" in (tmp_path / "reports" / "stall-report.md").read_text()
    assert 'name="test_hangs"' in (tmp_path / "junit.xml").read_text()


def test_no_matrix_and_no_default_timeout_unless_asked(tmp_path):
    (tmp_path / "test_cell.py").write_text("def test_takes_cell(cell):\n    pass\n")
    (tmp_path / "test_slow.py").write_text("import time\n\n\ndef test_slow():\n    time.sleep(0.1)\n")
    run = _run(tmp_path, "-q")
    assert "fixture 'cell' not found" in run.stdout, run.stdout
    assert "1 passed" in run.stdout


def test_expected_failures_are_counted_as_pytest_counts_them(tmp_path):
    (tmp_path / "test_known.py").write_text(
        "import pytest\n\n\n@pytest.mark.xfail(reason='known', strict=True)\ndef test_known():\n    assert False\n\n\n"
        "@pytest.mark.xfail(reason='fixed', strict=True)\ndef test_fixed():\n    pass\n\n\n"
        "def test_fine():\n    pass\n")
    run = _run(tmp_path, "--lk-report-dir", "reports")
    assert "INTERNALERROR" not in run.stdout + run.stderr, run.stdout + run.stderr
    assert run.returncode == 1   # the strict xfail that passed
    summary = (tmp_path / "reports" / "matrix-summary.md").read_text()
    assert "1 passed" in summary and "1 failed" in summary, summary
