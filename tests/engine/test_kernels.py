"""The fused kernels against the eager code they replace (tests/helpers/kernel_checks.py): on CUDA
where there is one, else on the CPU under Triton's interpreter, in a child process; then the launches it
made are compiled for an H100/H200 where Triton can build for one, in the test's own process, where the
interpreter never ran."""
import json
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
def test_fused_equals_eager(name, tmp_path):
    if torch.cuda.is_available():
        torch.manual_seed(0)
        kernel_checks.CHECKS[name](torch.device("cuda"))
        return
    env = {**os.environ, "TRITON_INTERPRET": "1", "LANEKEEPER_KERNELS": "fused"}
    launches = tmp_path / "launches.json"
    run = subprocess.run([sys.executable, "-m", "tests.helpers.kernel_checks", name, str(launches)], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    recorded = json.loads(launches.read_text())
    assert recorded, "the check launched no fused kernel"
    if _builds_for_nvidia():   # here, where the interpreter never ran: no new process and its imports
        kernel_checks.compile_for_hopper(recorded)


def _builds_for_nvidia() -> bool:
    """Triton's NVIDIA backend with its bundled ptxas: compiling needs no GPU."""
    import inspect

    import triton.backends

    backend = triton.backends.backends.get("nvidia")
    return backend is not None and (Path(inspect.getfile(backend.compiler)).parent / "bin" / "ptxas").exists()
