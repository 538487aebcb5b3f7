"""The test matrix: runner x CUDA graphs x handoff (on one stage-0 backend), its cells and their ids in
test names.  What each axis sets in a profile is `engine.profile.axes`."""
from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

from engine.profile.axes import CUDA_GRAPH, HANDOFFS, RUNNERS, axis_overrides, cell_id
from engine.profile.schema import BACKENDS

# Tests use short watchdog deadlines so that a stall turns red in seconds.  They come first: a run's
# own settings (--lk-set) are applied after them.
TEST_WATCHDOG = ["watchdog.handoff_deadline_s=5", "watchdog.stage_deadline_s=10"]


@dataclass(frozen=True)
class Cell:
    runner: str
    cuda_graph: str
    handoff: str
    backend: str = "torch"
    settings: tuple[str, ...] = ()   # the run's own profile settings (pytest --lk-set), applied last

    @property
    def id(self) -> str:
        return cell_id(self.runner, self.cuda_graph == "on", self.handoff == "async_chunk", self.backend)

    @property
    def overrides(self) -> list[str]:
        return axis_overrides(self.runner, self.cuda_graph, self.handoff, self.backend) + \
            ([f"backend={self.backend}"] if self.backend != "torch" else []) + list(self.settings)

    @classmethod
    def from_id(cls, cell_id: str) -> "Cell":
        *backend, runner, graph, handoff = cell_id.split("-")
        return cls(runner, "off" if graph == "no_cuda_graph" else "on", handoff, *backend)


CELL_RE = re.compile(rf"\b((?:{'|'.join(b for b in BACKENDS if b != 'torch')})-)?"
                     r"(v1|v2)-(cuda_graph|no_cuda_graph)-(async_chunk|full_payload)\b")


def cell_in(test_id: str) -> str | None:
    m = CELL_RE.search(test_id)
    return m.group(0) if m else None


def cells(runners=RUNNERS, cuda_graphs=CUDA_GRAPH, handoffs=HANDOFFS, backend: str = "torch",
          settings: tuple[str, ...] = ()) -> list[Cell]:
    return [Cell(r, g, h, backend, settings) for r, g, h in itertools.product(runners, cuda_graphs, handoffs)]
