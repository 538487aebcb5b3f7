"""The fused kernels against the eager code they replace (tests/helpers/kernel_checks.py): on CUDA
where there is one, else on the CPU under Triton's interpreter, in a child process."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers import kernel_checks

pytest.importorskip("triton")
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", sorted(kernel_checks.CHECKS))
def test_fused_equals_eager(name):
    if torch.cuda.is_available():
        torch.manual_seed(0)
        kernel_checks.CHECKS[name](torch.device("cuda"))
        return
    env = {**os.environ, "TRITON_INTERPRET": "1", "LANEKEEPER_KERNELS": "fused"}
    run = subprocess.run([sys.executable, "-m", "tests.helpers.kernel_checks", name], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
