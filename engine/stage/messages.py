"""What the engine and its two stage processes say to each other, one dataclass per kind.

    engine  -> stage 0 (in_q):       Add, Abort, Stop
    stage 0 -> stage 1 (handoff_q):  Frames, Abort, Stop
    stages  -> engine (out_q):       Ready, Beat, Codes, Decoded, StageError, Fatal, and
                                     engine.request.AudioChunk (stage 1's audio)

They cross process boundaries pickled; each receiver dispatches on the type in one place
(`TTSEngine._dispatch`, `engine.stage0.process`, `engine.stage1.process`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from engine.request import SpeechRequest
from engine.stage.stats import Code2WavStats, TalkerStats


@dataclass
class Add:
    request: SpeechRequest


@dataclass
class Abort:
    request_id: str


@dataclass
class Stop:
    pass


@dataclass
class Frames:
    """A window of codec frames handed from stage 0 to stage 1."""
    request_id: str
    start: int                 # index of the first frame in this window
    codes: np.ndarray          # [n, 16] int64
    final: bool


@dataclass
class Ready:
    """A stage is up; stage 0 says what it runs (backend, runner, captured graph sizes)."""
    stage: int
    info: dict = field(default_factory=dict)


@dataclass
class Beat:
    """A heartbeat with the stage's progress counters (engine.stage.stats)."""
    stage: int
    stats: TalkerStats | Code2WavStats


@dataclass
class Codes:
    """Stage 0 finished a request: all of its frames, why it stopped, and its stage-0 timings."""
    request_id: str
    codes: np.ndarray
    reason: str                # finished_stopped | finished_length
    timings: dict


@dataclass
class Decoded:
    """Stage 1 decoded a request's last window, `seconds` after its first."""
    request_id: str
    seconds: float


@dataclass
class StageError:
    """One request failed in a stage, which goes on with the others: refused (no traceback, e.g. longer
    than max_model_len) or raised while being handled (with the traceback)."""
    request_id: str
    stage: int
    message: str
    traceback: str | None = None


@dataclass
class Fatal:
    """A stage's loop raised: the stage is ending."""
    stage: int
    summary: str               # one line, for error messages
    traceback: str
