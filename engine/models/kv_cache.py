"""KV caches as views handed to attention for one forward pass.

- `CausalView`: no cache; attend within the given sequence (code predictor, codec decoder).
- `DynamicView`: runner v1; each request owns growing per-layer tensors and the batch is
  padded together anew every step.
- `StaticView`: runner v2; rows of preallocated [layers, slots, max_len] buffers, written
  with index_put_ so that a decode step can be captured in a CUDA graph.  A step attends
  over a key bucket that covers the positions in use (runner v2 captures one graph per
  bucket), which gives the same result as all keys for less work.
"""
from __future__ import annotations

import functools

import torch
from torch.nn.utils.rnn import pad_sequence


def _mask(key_pos: torch.Tensor, q_pos: torch.Tensor, window: int | None = None) -> torch.Tensor:
    """[B, S, K]: query b, s may see key k.  key_pos is [K] (shared) or [B, K] (a row's own)."""
    keys = key_pos.view(-1 if key_pos.dim() == 2 else 1, 1, key_pos.shape[-1])
    mask = keys <= q_pos[:, :, None]
    if window is not None:
        mask &= keys > q_pos[:, :, None] - window
    return mask


class CausalView:
    """Attend within the sequence itself; each row may start at its own position."""
    in_place = False

    def __init__(self, positions: torch.Tensor, window: int | None = None):
        self.mask = _mask(positions, positions, window)

    def update(self, layer, k, v):
        return k, v, self.mask


class RequestKV:
    """Per-request cache of runner v1: one [T, kv_heads, head_dim] tensor per layer."""

    def __init__(self, layers: int):
        self.k: list[torch.Tensor | None] = [None] * layers
        self.v: list[torch.Tensor | None] = [None] * layers

    def __len__(self):
        return 0 if self.k[0] is None else self.k[0].shape[0]


class DynamicView:
    in_place = False

    def __init__(self, caches: list[RequestKV], positions: torch.Tensor):
        self.caches = caches
        self.positions = positions
        self.mask = None

    def update(self, layer, k, v):
        for b, cache in enumerate(self.caches):
            cache.k[layer] = k[b] if cache.k[layer] is None else torch.cat((cache.k[layer], k[b]))
            cache.v[layer] = v[b] if cache.v[layer] is None else torch.cat((cache.v[layer], v[b]))
        keys = pad_sequence([c.k[layer] for c in self.caches], batch_first=True)
        values = pad_sequence([c.v[layer] for c in self.caches], batch_first=True)
        if self.mask is None:  # same for every layer
            key_pos = torch.arange(keys.shape[1], device=keys.device)
            self.mask = _mask(key_pos, self.positions)
        return keys, values, self.mask


class StaticKV:
    def __init__(self, layers: int, slots: int, max_len: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device):
        shape = (layers, slots, max_len, kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.key_pos = torch.arange(max_len, device=device)
        self.slots, self.max_len = slots, max_len

    def view(self, slots: int | torch.Tensor, positions: torch.Tensor, key_len: int | None = None) -> "StaticView":
        return StaticView(self, slots, positions, key_len or self.max_len)


class StaticView:
    """Rows of the static buffers; row b's queries sit at positions[b].  `slots` is the first of B
    consecutive rows (a decode step: the persistent batch, read as a slice, which the fused decode kernel
    also reads and writes in place) or a tensor of B rows (a batch of prefills, read by gathering).
    The rows and mask the eager path needs are made when it first asks: the fused path needs neither."""

    def __init__(self, kv: StaticKV, slots: int | torch.Tensor, positions: torch.Tensor, key_len: int):
        self.kv, self.key_len, self.positions = kv, key_len, positions
        b = positions.shape[0]
        self.read = slice(slots, slots + b) if isinstance(slots, int) else slots
        self.in_place = isinstance(slots, int)

    @functools.cached_property
    def rows(self) -> torch.Tensor:
        b, s = self.positions.shape
        slots = self.read if not self.in_place else torch.arange(b, device=self.positions.device) + self.read.start
        return slots[:, None].expand(b, s)

    @functools.cached_property
    def mask(self) -> torch.Tensor:
        return _mask(self.kv.key_pos[:self.key_len], self.positions)

    def buffers(self, layer) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's key and value buffers, [slots, positions, kv_heads, head_dim]."""
        return self.kv.k[layer], self.kv.v[layer]

    def update(self, layer, k, v):
        self.kv.k[layer].index_put_((self.rows, self.positions), k)
        self.kv.v[layer].index_put_((self.rows, self.positions), v)
        keys = slice(0, self.key_len)
        return self.kv.k[layer][self.read, keys], self.kv.v[layer][self.read, keys], self.mask
