"""Which of the waiting windows share a codec pass.

A pass costs a fixed part (its kernels, however few rows they hold) and a part for each padded
row-frame.  One pass for everything pads a one-frame first window to the longest window waiting;
one pass per length pays the fixed part again and again.  A pass's cost depends only on how many
windows it holds and on the longest of them, so among the ways to split the windows, groups of
neighbours in length are as cheap as any: sorted by length, they are cut into consecutive groups
of least summed cost, as the caller's estimate has it.  A pass, once launched, is read back after the
next one is launched (`Launched`), so its host work hides behind the device's.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np
import torch

from engine.models.upload import Download


def plan(lengths: Sequence[int], cost: Callable[[int, int], float], max_rows: int) -> list[range]:
    """Consecutive ranges over `lengths` (ascending), each of at most max_rows windows, whose
    summed `cost(windows, longest)` is least."""
    best = [0.0] + [math.inf] * len(lengths)   # best[i]: the least cost of the first i windows
    cut = [0] * (len(lengths) + 1)               # where the last group of those i starts
    for end in range(1, len(lengths) + 1):
        for start in range(max(0, end - max_rows), end):
            c = best[start] + cost(end - start, lengths[end - 1])
            if c < best[end]:
                best[end], cut[end] = c, start
    groups, end = [], len(lengths)
    while end:
        groups.append(range(cut[end], end))
        end = cut[end]
    return groups[::-1]


class Launched:
    """A launched codec pass: its jobs and shape, and their audio on its way to the host."""

    def __init__(self, group: list, rows: int | None, t: int, audio: torch.Tensor):
        self.group, self.rows, self.t = group, rows, t
        self.audio = Download(audio)

    def read(self) -> np.ndarray:
        return self.audio.wait().numpy()
