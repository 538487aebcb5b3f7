"""Checks of the fused kernels against the eager code they replace, on the same inputs.

tests/engine/test_kernels.py runs each on CUDA where there is one, else in a child process
under Triton's interpreter (which must be switched on before Triton is first imported):

    TRITON_INTERPRET=1 python -m tests.helpers.kernel_checks snake
"""
import sys

import torch
import torch.nn.functional as F

from engine.models import build_models, kernels
from engine.models.code2wav import SnakeBeta
from engine.stage0.sampling import sample


def snake(device):
    act = SnakeBeta(6).to(device)
    with torch.no_grad():
        act.log_alpha.normal_(), act.log_beta.normal_()
    x = torch.randn(2, 6, 3001, device=device)
    with kernels.unfused():
        want = act(x)
    assert kernels.use(x)
    torch.testing.assert_close(act(x), want, rtol=1e-5, atol=1e-5)


def swiglu(device):
    gate_up = torch.randn(3, 5, 2 * 40, device=device)
    torch.testing.assert_close(kernels.swiglu(gate_up), F.silu(gate_up[..., :40]) * gate_up[..., 40:])


def sampling(device):
    """Greedy rows, top-k of 1, of 0 (off) and in between, top-p below 1 and not, specials masked: the
    same tokens as the eager sampler, row for row, each row reading its own slot's parameters."""
    for vocab in (2048, 3072):
        gen = torch.Generator().manual_seed(vocab)
        slots, rows_n = 70, 64
        for trial in range(4):
            logits = torch.randn(rows_n, vocab, generator=gen) * 3
            if vocab == 3072:
                logits[:, 2048:] = float("-inf")
                logits[:, 2150] = 1.0
            temperature = torch.rand(slots, generator=gen) + 0.3
            temperature[trial::7] = 0.0
            top_k = torch.randint(0, 100, (slots,), generator=gen)
            top_k[::5], top_k[1::9] = 0, 1
            top_p = torch.ones(slots)
            top_p[trial::3] = torch.rand(slots, generator=gen)[trial::3] * 0.9 + 0.05
            u = torch.rand(slots, 16, generator=gen)
            rows = torch.randperm(slots, generator=gen)[:rows_n]
            args = [t.to(device) for t in (logits, rows, temperature, top_k, top_p, u)]
            got = kernels.sample(*args, codebook=trial).cpu()
            want = sample(logits, temperature[rows], top_k[rows], top_p[rows], u[rows, trial])
            # CUDA sums the distribution in another order than the CPU: a draw on an edge may flip
            assert (got != want).sum() <= (1 if device.type == "cuda" else 0), (vocab, trial)


def codec_pass(device):
    codec = build_models("tiny", parts=("codec",), device=str(device)).codec
    codes = torch.randint(0, 2048, (2, 12, 16), device=device)
    with kernels.unfused():
        want = codec(codes)
    torch.testing.assert_close(codec(codes), want, rtol=1e-4, atol=1e-4)


CHECKS = {f.__name__: f for f in (snake, swiglu, sampling, codec_pass)}

if __name__ == "__main__":
    torch.manual_seed(0)
    CHECKS[sys.argv[1]](torch.device("cpu"))
