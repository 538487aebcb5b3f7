"""Where the fused kernels run, and their compilation: see engine/models/kernels/__init__.py."""
from __future__ import annotations

import os
from contextlib import contextmanager

import torch

try:
    import triton
    import triton.language as tl
except ImportError:   # a CPU install without Triton runs the eager code
    triton = tl = None

_off = os.environ.get("LANEKEEPER_KERNELS", "fused") == "torch"


def use(x: torch.Tensor) -> bool:
    if triton is None or _off:
        return False
    return x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"


@contextmanager
def unfused():
    """The eager path inside the block, whatever the environment says."""
    global _off
    saved, _off = _off, True
    try:
        yield
    finally:
        _off = saved


_compiled: dict[tuple[str, str, bool], object] = {}


def compiled(fn, *helpers):
    """fn as a Triton kernel for the environment of this moment.  The helpers it calls become compiled
    functions too (a kernel calls only those; under the interpreter, plain ones)."""
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    key = (fn.__module__, fn.__qualname__, interpret)
    if key not in _compiled:
        for helper in helpers:
            plain = getattr(helper, "fn", helper)
            fn.__globals__[plain.__name__] = plain if interpret else triton.jit(plain)
        _compiled[key] = triton.jit(fn)
    return _compiled[key]
