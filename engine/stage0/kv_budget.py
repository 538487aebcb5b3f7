"""How much static KV cache runner v2 gets, and the key lengths its frame graphs are captured for."""
from __future__ import annotations

import torch


class CapacityError(RuntimeError):
    """The profile asks for more static KV cache than the memory budget allows."""


def fit_kv(shape, slots, max_len, dtype, device, utilization) -> int:
    """Positions of static KV cache per slot: max_len when slots x max_len fits the memory budget, else
    as many as do fit (requests longer than that are refused one by one), down to a floor."""
    per_position = 2 * shape.layers * shape.kv_heads * shape.head_dim * torch.finfo(dtype).bits // 8
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
    else:
        import psutil

        total = psutil.virtual_memory().total
    budget = utilization * total
    fits = min(max_len, int(budget // (slots * per_position)) // 256 * 256)
    if fits < min(max_len, 512):
        gib = 1024 ** 3
        raise CapacityError(
            f"runner v2's static KV cache for {slots} seqs needs {slots * min(max_len, 512) * per_position / gib:.1f} "
            f"GiB for even {min(max_len, 512)} positions each, but stages.0.gpu_memory_utilization={utilization} of "
            f"{total / gib:.0f} GiB on {device.type} allows {budget / gib:.1f} GiB; lower stages.0.max_num_seqs, "
            f"raise stages.0.gpu_memory_utilization, or use runner v1")
    return fits


def buckets(kv_len: int) -> list[int]:
    """Key lengths a decode step attends over: powers of two from 256, then the whole cache."""
    out, b = [], 256
    while b < kv_len:
        out.append(b)
        b *= 2
    return out + [kv_len]
