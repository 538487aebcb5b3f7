"""What a stage's heartbeat says about its progress: the watchdog tells a stall from slow work by these
counters, the engine follows each request's frames by them, and /metrics shows the clocks."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TalkerStats:
    """Stage 0.  A handoff begun and not yet done means stage 0 is inside a handoff, so the watchdog
    calls a long wait there a handoff stall, not a stalled stage."""
    depth: int = 0                       # requests waiting or running
    steps: int = 0
    handoffs_begun: int = 0
    handoffs_done: int = 0
    handoff_request: str | None = None   # the request of the latest handoff
    requests: dict[str, tuple[int, int]] = field(default_factory=dict)   # id -> (frames produced, handed off)
    seconds: dict[str, float] = field(default_factory=dict)              # part of the loop -> seconds in it


@dataclass
class Code2WavStats:
    """Stage 1.  Windows per pass is how well it batches."""
    depth: int = 0                       # requests with a window decoded and the last one not yet
    busy: bool = False                   # decoding now
    windows: int = 0
    passes: int = 0
    window_frames: int = 0               # the decoded windows' frames, context included
    pass_frames: int = 0                 # what their passes ran, padding included
    replay_s: float = 0.0                # the captured passes' device time, as each was timed alone
    seconds: dict[str, float] = field(default_factory=dict)


STATS = {0: TalkerStats, 1: Code2WavStats}
