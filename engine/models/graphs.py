"""CUDA graphs for fixed shapes: capture a function once per key (batch size, length bucket) and
replay it.  Stage 0 captures whole frame steps and the code predictor; stage 1 the codec.
Elsewhere than on CUDA the function simply runs."""
from __future__ import annotations

import bisect

import torch

_capturing = False


def capturing() -> bool:
    """Whether a GraphPool is warming up or capturing: code inside must serve every input the graph
    will see, not only today's."""
    return _capturing


class GraphPool:
    """Runs `fn(*key)` for padded shapes; on CUDA each key is captured once and replayed."""

    def __init__(self, fn, keys: list[tuple], device: torch.device):
        self.fn = fn
        self.graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, object]] = {}
        if device.type == "cuda":
            global _capturing
            pool = None
            _capturing = True
            try:
                for key in sorted(keys, reverse=True):   # largest first, so the smaller ones fit in its pool
                    fn(*key)  # a warm-up run of exactly what is captured next
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=pool):
                        out = fn(*key)
                    pool = graph.pool()
                    self.graphs[key] = (graph, out)
            finally:
                _capturing = False
            torch.cuda.synchronize()

    def replay_seconds(self, repeats: int = 3) -> dict[tuple, float]:
        """Each captured key's replay time on the device, the least of a few: what a caller weighs when it
        chooses among padded shapes (another process's work on the GPU only makes a replay slower)."""
        times = {}
        for key, (graph, _) in self.graphs.items():
            runs = []
            for _ in range(repeats):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                graph.replay()
                end.record()
                end.synchronize()
                runs.append(start.elapsed_time(end) / 1000)
            times[key] = min(runs)
        return times

    def __call__(self, *key):
        if key in self.graphs:
            graph, out = self.graphs[key]
            graph.replay()
            return out
        return self.fn(*key)


def padded(sizes: list[int], n: int) -> int | None:
    """The smallest captured size that holds n, or None past the largest."""
    i = bisect.bisect_left(sizes, n)
    return sizes[i] if i < len(sizes) else None
