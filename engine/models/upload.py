"""Host tensors to the device, and the device's results to the host, without waiting for the device.

A plain copy from pageable memory waits for everything queued on the stream before it.  In stage 0 that
is the frame step in flight, so a request admitted, or a stop unmasked, while a step runs would hold the
host until the step ends and the next step could not be launched ahead of its read-back.  The way back is
queued too (`Download`): a stage launches its next step or pass before it waits for this one's results.
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


class Download:
    """A device tensor on its way to the host, queued behind the work that makes it (into pinned memory,
    on CUDA); `wait` returns it once there.  Queued before the stream's next work, it is copied out even
    of a captured graph's output, which that work may overwrite."""

    def __init__(self, tensor: torch.Tensor):
        self.host = tensor.to("cpu", non_blocking=True)
        self.done = torch.cuda.Event() if tensor.is_cuda else None
        if self.done is not None:
            self.done.record()

    def wait(self) -> torch.Tensor:
        if self.done is not None:
            self.done.synchronize()
        return self.host
