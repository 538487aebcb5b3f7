"""Whether the platform a profile was resolved for can run here.

Resolution never asks (pins and `profile check` resolve all six platforms on any machine); starting an
engine does.  The engine computes on CUDA or on the CPU: a `cuda` profile needs a CUDA device, and the
other accelerator platforms (rocm, npu, xpu, musa) have no device code here.  Either runs on the CPU
only when asked (`cpu_fallback`), and then says so.
"""
from __future__ import annotations

import logging

from engine.errors import UserError

log = logging.getLogger("lanekeeper.engine")


class PlatformUnavailable(UserError):
    pass


def usable_platform(platform: str, cpu_fallback: bool) -> str:
    """The platform the stages will run on: the profile's own, or "cpu" when falling back.  Only a device
    platform asks torch, which a CPU engine's client process then never imports."""
    if platform == "cpu":
        return platform
    import torch

    if platform == "cuda" and torch.cuda.is_available():
        return platform
    why = "no CUDA device is visible" if platform == "cuda" else "this engine has no device code for it"
    if not cpu_fallback:
        raise PlatformUnavailable(f"platform {platform}: {why}; resolve the profile for a platform this machine "
                                  f"has, or allow the CPU (--cpu-fallback, TTSEngine(cpu_fallback=True))")
    log.warning("platform %s: %s; running on the CPU (cpu fallback)", platform, why)
    print(f"lanekeeper: platform {platform}: {why}; running on the CPU (cpu fallback)", flush=True)
    return "cpu"
