"""The test matrix: runner x CUDA graphs x handoff, and what each axis sets in a profile.

The graphs-off cell mirrors the anchor's `no_cuda_graph` test: eager on both stages
and no async scheduling.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

RUNNERS = ("v1", "v2")
CUDA_GRAPH = ("on", "off")
HANDOFFS = ("async_chunk", "full_payload")


def axis_overrides(runner: str | None = None, cuda_graph: str | None = None,
                   handoff: str | None = None) -> list[str]:
    out = []
    if runner:
        out.append(f"model_runner={runner}")
    if cuda_graph:
        eager = str(cuda_graph == "off").lower()
        out += [f"stages.0.enforce_eager={eager}", f"stages.1.enforce_eager={eager}"]
        if cuda_graph == "off":
            out += ["stages.0.async_scheduling=false", "stages.1.async_scheduling=false"]
    if handoff:
        out.append(f"async_chunk={str(handoff == 'async_chunk').lower()}")
    return out


@dataclass(frozen=True)
class Cell:
    runner: str
    cuda_graph: str
    handoff: str

    @property
    def id(self) -> str:
        graph = "cuda_graph" if self.cuda_graph == "on" else "no_cuda_graph"
        return f"{self.runner}-{graph}-{self.handoff}"

    @property
    def overrides(self) -> list[str]:
        return axis_overrides(self.runner, self.cuda_graph, self.handoff)

    @classmethod
    def from_id(cls, cell_id: str) -> "Cell":
        runner, graph, handoff = cell_id.split("-")
        return cls(runner, "off" if graph == "no_cuda_graph" else "on", handoff)


def cells(runners=RUNNERS, cuda_graphs=CUDA_GRAPH, handoffs=HANDOFFS) -> list[Cell]:
    return [Cell(r, g, h) for r, g, h in itertools.product(runners, cuda_graphs, handoffs)]
