"""Host tensors to the device without waiting for the device.

A plain copy from pageable memory waits for everything queued on the stream before it.  In stage 0 that
is the frame step in flight, so a request admitted, or a stop unmasked, while a step runs would hold the
host until the step ends and the next step could not be launched ahead of its read-back.
"""
from __future__ import annotations

import torch


def upload(host: torch.Tensor, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """`host` on `device`, queued behind the stream's work instead of waited for: on CUDA through pinned
    memory, whose block the caching host allocator keeps until the copy has run."""
    if dtype is not None:
        host = host.to(dtype)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)
