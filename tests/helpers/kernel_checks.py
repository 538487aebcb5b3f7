"""Checks of the fused kernels against the eager code they replace, on the same inputs.

tests/engine/test_kernels.py runs each on CUDA where there is one, else in a child process
under Triton's interpreter (which must be switched on before Triton is first imported), and
there records its launches, which a process where it never ran compiles for an H100/H200 (sm_90):

    TRITON_INTERPRET=1 python -m tests.helpers.kernel_checks snake launches.json
    python -m tests.helpers.kernel_checks --hopper launches.json
"""
import contextlib
import copy
import importlib
import inspect
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from engine.models import kernels
from engine.models.build import build_models
from engine.models.kernels import jit
from engine.models.kernels.jit import triton
from engine.models.code2wav import ResidualUnit, SnakeBeta
from engine.models.kv_cache import StaticKV
from engine.models.layers import DecoderLayer, RMSNorm, Rotary, normed_linear
from engine.models.presets import DecoderShape
from engine.stage0.sampling import sample


def snake(device):
    """SnakeBeta over time-major activations, read through a view with its own strides (a cropped
    upsample's output), with the bias the product before it left out, written after causal zeros and
    before trailing ones (a folded dilated conv's rounding)."""
    act = SnakeBeta(6).to(device)
    with torch.no_grad():
        act.log_alpha.normal_(), act.log_beta.normal_()
    x = torch.randn(2, 3100, 6, device=device)[:, :3001]
    bias = torch.randn(6, device=device)
    for b, pad, rows in ((None, 0, None), (bias, 0, None), (bias, 18, None), (bias, 18, 3027)):
        with kernels.unfused():
            want = act(x, b, pad, rows)
        assert kernels.use(x)
        torch.testing.assert_close(act(x, b, pad, rows), want, rtol=1e-5, atol=1e-5)


def residual_unit(device):
    """A codec residual unit: SnakeBeta into the dilated conv and after it, then the 1x1 conv and the
    residual add as one product, at channel counts that tile evenly and one that does not, with and
    without the upsample's bias still to add, over a strided input; bf16 on CUDA too."""
    for dtype in (torch.float32, torch.bfloat16) if device.type == "cuda" else (torch.float32,):
        for channels in (32, 96, 40):
            unit = ResidualUnit(channels, 7, 3).to(device, dtype)
            with torch.no_grad():
                for act in (unit.act1, unit.act2):
                    act.log_alpha.normal_(0, 0.3), act.log_beta.normal_(0, 0.3)
            x = torch.randn(2, 133, channels, device=device, dtype=dtype)[:, :100]
            for bias in (None, torch.randn(channels, device=device, dtype=dtype)):
                with kernels.unfused():
                    want = unit(x, bias)
                assert kernels.use(x)
                torch.testing.assert_close(unit(x, bias), want, rtol=_tol(device, dtype), atol=_tol(device, dtype))


def swiglu(device):
    gate_up = torch.randn(3, 5, 2 * 40, device=device)
    torch.testing.assert_close(kernels.swiglu(gate_up), F.silu(gate_up[..., :40]) * gate_up[..., 40:])


def norm_linear(device):
    """RMS norm, the gate/up product and SwiGLU, with the norm folded into the product (its row scale then
    applied by the activation's kernel): the same as norm, product and activation, for one row, a few, a
    tile's worth and more, at a hidden size that is not a power of two; bf16 on CUDA too, the engine's
    dtype there."""
    for dtype in (torch.float32, torch.bfloat16) if device.type == "cuda" else (torch.float32,):
        norm = RMSNorm(200).to(device, dtype)
        with torch.no_grad():
            norm.weight.uniform_(0.5, 1.5)
        weight = (torch.randn(2 * 48, 200, device=device) / 200 ** 0.5).to(dtype)
        folded, folded_weight = copy.deepcopy(norm), weight.clone()
        folded.fold_into(folded_weight)
        for rows in (1, 5, 64, 300):
            x = torch.randn(rows, 1, 200, device=device, dtype=dtype) * 3
            with kernels.unfused():
                want = normed_linear(x, norm, weight, gated=True)
            assert kernels.use(x)
            tol = 1e-4 if device.type == "cpu" else 2e-2 if dtype == torch.bfloat16 else 5e-3
            torch.testing.assert_close(normed_linear(x, folded, folded_weight, gated=True), want, rtol=tol, atol=tol)


def sampling(device):
    """Greedy rows, top-k of 1, of 0 (off) and in between, top-p below 1 and not, specials masked: the
    same tokens as the eager sampler, row for row, each row reading its own slot's parameters."""
    for vocab in (2048, 3072):
        gen = torch.Generator().manual_seed(vocab)
        slots, rows_n = 24, 16
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
            table = torch.randn(vocab, 24, device=device)
            into = torch.zeros(rows_n, 2, 24, device=device)
            got = kernels.sample(*args, codebook=trial, embed=(table, into[:, 1])).cpu()
            want = sample(logits, temperature[rows], top_k[rows], top_p[rows], u[rows, trial])
            assert torch.equal(into[:, 1].cpu(), table[got].cpu()) and not into[:, 0].any()
            # CUDA sums the distribution in another order than the CPU: a draw on an edge may flip
            assert (got != want).sum() <= (1 if device.type == "cuda" else 0), (vocab, trial)


def decode_attention(device):
    """A layer's attention over static buffers, one step of rows at their own positions (one query each,
    and two, as the code predictor's first pass runs), GQA: the fused kernels write the same keys and
    values into the cache and return the same output as the eager path, and so they do with the layer's
    input norm folded into its q/k/v product (the kernel then applies each row's scale)."""
    shape = DecoderShape(hidden=96, layers=1, heads=4, kv_heads=2, head_dim=32, intermediate=64)
    layer = DecoderLayer(shape, 0).to(device)
    rotary = Rotary(shape.head_dim, shape.rope_theta, 512).to(device)
    with torch.no_grad():
        for w in (layer.attn.q_norm.weight, layer.attn.k_norm.weight, layer.input_norm.weight):
            w.uniform_(0.5, 1.5)
    folded = copy.deepcopy(layer)
    folded.fold_norms()
    # keys over a 256-position bucket, and over 16 (the code predictor's cache: the kernel's key block shrinks)
    for steps, first, key_len in ((1, [0, 7, 63, 64, 200], 256), (2, [0, 7, 63], 256), (2, [0, 5, 13], 16)):
        kv = StaticKV(1, 8, 300, shape.kv_heads, shape.head_dim, torch.float32, device)
        kv.k.normal_(), kv.v.normal_()
        first, rows = torch.tensor(first, device=device), len(first)
        positions = first[:, None] + torch.arange(steps, device=device)
        x = torch.randn(rows, steps, shape.hidden, device=device)
        results = []
        for fused, model in ((False, layer), (True, layer), (True, folded)):
            cache = StaticKV(1, 8, 300, shape.kv_heads, shape.head_dim, torch.float32, device)
            cache.k.copy_(kv.k), cache.v.copy_(kv.v)
            view = cache.view(2, positions, key_len)
            with torch.no_grad(), (contextlib.nullcontext() if fused else kernels.unfused()):
                assert kernels.use(x) == fused
                out = model.attn(x.clone(), model.input_norm, rotary(positions, x.dtype), view)
                results.append((out, cache.k, cache.v))
        for got in results[1:]:
            for tensor, want in zip(got, results[0]):
                torch.testing.assert_close(tensor, want, rtol=2e-3, atol=2e-3)


def codec_pass(device):
    codec = build_models("tiny", parts=("codec",), device=str(device)).codec
    codes = torch.randint(0, 2048, (2, 4, 16), device=device)
    with kernels.unfused():
        want = codec(codes)
    torch.testing.assert_close(codec(codes), want, rtol=_tol(device, torch.float32), atol=_tol(device, torch.float32))


def _tol(device, dtype) -> float:
    """The codec's kernels against eager torch: on CUDA Triton's sine is the fast approximate one, and a
    difference at one layer grows through the ones after it."""
    return 5e-2 if dtype == torch.bfloat16 else 1e-4 if device.type == "cpu" else 1e-3


CHECKS = {f.__name__: f for f in (snake, residual_unit, swiglu, sampling, decode_attention, norm_linear,
                                         codec_pass)}

# -- the same launches compiled for the GPU: what the interpreter cannot show (a kernel calling an
# uncompiled helper, a loop variable that changes type) fails here, on a machine without one

TRITON_TYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.int64: "i64",
                torch.int32: "i32", torch.bool: "i1"}


def recorded_launches():
    """Patches the kernel modules so that every launch is recorded (kernel, helpers, signature and
    constants, as names and values) before it runs."""
    launches = []

    def recording(compiled):
        def wrapped(fn, *helpers):
            kernel = compiled(fn, *helpers)

            class Launcher:
                def __getitem__(self, grid):
                    def launch(*args, **kwargs):
                        names = list(inspect.signature(fn).parameters)
                        constants = {k: v for k, v in kwargs.items() if k in names}
                        signature = {name: _triton_type(arg) for name, arg in zip(names, args)}
                        signature.update({name: "constexpr" for name in constants})
                        launch = {"module": fn.__module__, "kernel": fn.__name__, "signature": signature,
                                  "helpers": [getattr(h, "fn", h).__name__ for h in helpers], "constants": constants}
                        if launch not in launches:
                            launches.append(launch)
                        return kernel[grid](*args, **kwargs)
                    return launch
            return Launcher()
        return wrapped

    for name, module in list(sys.modules.items()):   # every kernel module: each holds jit's `compiled`
        if name.startswith("engine.models.kernels.") and module is not jit \
                and vars(module).get("compiled") is jit.compiled:
            module.compiled = recording(jit.compiled)
    return launches


def _triton_type(arg) -> str:
    if isinstance(arg, torch.Tensor):
        return "*" + TRITON_TYPES[arg.dtype]
    if isinstance(arg, bool):
        return "i1"
    if isinstance(arg, int):
        return "i32" if -2 ** 31 <= arg < 2 ** 31 else "i64"
    return "fp32"


def compile_for_hopper(launches: list[dict]) -> None:
    """In a process where the interpreter never ran (it patches triton.language while it runs)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    for launch in launches:
        module = importlib.import_module(launch["module"])
        kernel = jit.compiled(getattr(module, launch["kernel"]), *(getattr(module, h) for h in launch["helpers"]))
        source = ASTSource(fn=kernel, signature=launch["signature"], constexprs=launch["constants"])
        assert triton.compile(source, target=GPUTarget("cuda", 90, 32)).asm.get("cubin"), launch["kernel"]


if __name__ == "__main__":
    if sys.argv[1] == "--hopper":   # compile the launches a check recorded
        compile_for_hopper(json.loads(Path(sys.argv[2]).read_text()))
        sys.exit()
    torch.manual_seed(0)
    launches = recorded_launches()
    CHECKS[sys.argv[1]](torch.device("cpu"))
    if len(sys.argv) > 2:
        Path(sys.argv[2]).write_text(json.dumps(launches))
