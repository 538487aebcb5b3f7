"""The README is run, not just read: each block tagged `sh` or `python` runs here on the CPU, the Python
ones saved as a script, from a scratch directory against this checkout.  Blocks for elsewhere say so
in their tag (`sh gpu`, `sh setup`: what `.ci/run` runs) or are not code (`text`, `console`, `json`)."""
import os
import re
import subprocess
import sys

import pytest

from tests.helpers.repo import ROOT

BLOCK = re.compile(r"^```(?P<info>[^\n]*)\n(?P<body>.*?)^```$", re.M | re.S)
RUN = {"sh", "python"}
ELSEWHERE = {"sh gpu", "sh setup", "text", "console", "json"}


def blocks() -> list[tuple[str, str]]:
    return [(m["info"].strip(), m["body"]) for m in BLOCK.finditer((ROOT / "README.md").read_text())]


def test_every_block_says_where_it_runs():
    infos = [info for info, _ in blocks()]
    assert set(infos) <= RUN | ELSEWHERE, set(infos) - RUN - ELSEWHERE
    assert "python" in infos and "sh" in infos


@pytest.mark.parametrize("n", [i for i, (info, _) in enumerate(blocks()) if info in RUN])
def test_block_runs(n, tmp_path):
    info, body = blocks()[n]
    env = {**os.environ, "LANEKEEPER_ROOT": str(ROOT),
           "PATH": f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ['PATH']}"}
    if info == "python":
        (tmp_path / "example.py").write_text(body)
        cmd = [sys.executable, "example.py"]
    else:
        cmd = ["bash", "-euo", "pipefail", "-c", body]
    run = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"README block {n} ({info}):\n{body}\n{run.stdout[-2000:]}\n{run.stderr[-3000:]}"
    assert "Traceback" not in run.stderr
