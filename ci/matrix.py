"""The test matrix: runner x CUDA graphs x handoff (on one stage-0 backend), and what each axis sets
in a profile.

The graphs-off cell mirrors vllm-omni's `no_cuda_graph` test: an eager talker with no
async scheduling (code2wav, stage 1, has no graphs or scheduler to turn off).
"""
from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

from engine.config import cell_id
from engine.profile_schema import BACKENDS

RUNNERS = ("v1", "v2")
CUDA_GRAPH = ("on", "off")
HANDOFFS = ("async_chunk", "full_payload")


# Tests use short watchdog deadlines so that a stall turns red in seconds.
TEST_WATCHDOG = ["watchdog.handoff_deadline_s=5", "watchdog.stage_deadline_s=10"]


def axis_overrides(runner: str | None = None, cuda_graph: str | None = None,
                   handoff: str | None = None) -> list[str]:
    out = []
    if runner:
        out.append(f"model_runner={runner}")
    if cuda_graph:
        eager = str(cuda_graph == "off").lower()
        out.append(f"stages.0.enforce_eager={eager}")
        if cuda_graph == "off":
            out.append("stages.0.async_scheduling=false")
    if handoff:
        out.append(f"async_chunk={str(handoff == 'async_chunk').lower()}")
    return out


@dataclass(frozen=True)
class Cell:
    runner: str
    cuda_graph: str
    handoff: str
    backend: str = "torch"

    @property
    def id(self) -> str:
        return cell_id(self.runner, self.cuda_graph == "on", self.handoff == "async_chunk", self.backend)

    @property
    def overrides(self) -> list[str]:
        return axis_overrides(self.runner, self.cuda_graph, self.handoff) + \
            ([f"backend={self.backend}"] if self.backend != "torch" else [])

    @classmethod
    def from_id(cls, cell_id: str) -> "Cell":
        *backend, runner, graph, handoff = cell_id.split("-")
        return cls(runner, "off" if graph == "no_cuda_graph" else "on", handoff, *backend)


TASK_NEEDLES = (("voice_design", "VoiceDesign"), ("voice_clone", "Base"), ("test_base", "Base"))
CELL_RE = re.compile(rf"\b((?:{'|'.join(b for b in BACKENDS if b != 'torch')})-)?"
                     r"(v1|v2)-(cuda_graph|no_cuda_graph)-(async_chunk|full_payload)\b")


def task_of(test_id: str) -> str:
    """The task type a matrix test exercises, from its id."""
    for needle, task in TASK_NEEDLES:
        if needle in test_id:
            return task
    return "CustomVoice"


def cell_in(test_id: str) -> str | None:
    m = CELL_RE.search(test_id)
    return m.group(0) if m else None


def cells(runners=RUNNERS, cuda_graphs=CUDA_GRAPH, handoffs=HANDOFFS, backend: str = "torch") -> list[Cell]:
    return [Cell(r, g, h, backend) for r, g, h in itertools.product(runners, cuda_graphs, handoffs)]
