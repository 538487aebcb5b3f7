"""The matrix's axes as profile settings: runner, CUDA graphs and handoff, and the id of the cell they make.

The graphs-off cell mirrors vllm-omni's `no_cuda_graph` test: an eager talker, and on vLLM also no
async scheduling (the built-in talker has no async scheduler, and refuses the key; code2wav, stage 1,
has no graphs or scheduler to turn off).
"""
from __future__ import annotations

RUNNERS = ("v1", "v2")
CUDA_GRAPH = ("on", "off")
HANDOFFS = ("async_chunk", "full_payload")


def axis_overrides(runner: str | None = None, cuda_graph: str | None = None, handoff: str | None = None,
                   backend: str = "torch") -> list[str]:
    out = []
    if runner:
        out.append(f"model_runner={runner}")
    if cuda_graph:
        out.append(f"stages.0.enforce_eager={str(cuda_graph == 'off').lower()}")
        if cuda_graph == "off" and backend == "vllm":
            out.append("stages.0.async_scheduling=false")
    if handoff:
        out.append(f"async_chunk={str(handoff == 'async_chunk').lower()}")
    return out


def cell_id(runner: str, cuda_graph: bool, async_chunk: bool, backend: str = "torch") -> str:
    """runner-graph-handoff, prefixed by the stage-0 backend when it is not the built-in one."""
    cell = f"{runner}-{'cuda_graph' if cuda_graph else 'no_cuda_graph'}-{'async_chunk' if async_chunk else 'full_payload'}"
    return cell if backend == "torch" else f"{backend}-{cell}"
