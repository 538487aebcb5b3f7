"""One request's progress through both stages, as the engine and its watchdog follow it."""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from engine.diagnosis import Diagnosis
from engine.request import AudioChunk, SpeechRequest


@dataclass
class Tracked:
    request: SpeechRequest
    submitted: float
    events: "queue.Queue" = field(default_factory=queue.Queue)
    chunks: list[np.ndarray] = field(default_factory=list)
    codes: np.ndarray | None = None
    reason: str | None = None
    timings: dict = field(default_factory=dict)
    audio_done: bool = False
    error: Diagnosis | None = None
    done: threading.Event = field(default_factory=threading.Event)
    listener: "Callable[[AudioChunk | None], None] | None" = None
    # progress the watchdog reads: frames produced / handed off by stage 0, consumed by stage 1
    produced: int = 0
    handed_off: int = 0
    consumed: int = 0
    stage0_done: bool = False
    pending_since: float | None = None   # since when handed-off frames have been waiting for stage 1

    def progress(self, produced: int | None = None, handed_off: int | None = None, consumed: int = 0) -> None:
        if produced is not None:
            self.produced = max(self.produced, produced)
        if handed_off is not None:
            self.handed_off = max(self.handed_off, handed_off)
        self.consumed += consumed
        if self.handed_off <= self.consumed:
            self.pending_since = None
        elif self.pending_since is None or consumed:
            self.pending_since = time.monotonic()

    def emit(self, item) -> None:
        """An audio chunk, or None at the end, to the stream consumer (a queue or a callback)."""
        (self.listener or self.events.put)(item)
