"""The stage-0 side of the handoff: when to send which frames to stage 1, and sending them.

async_chunk sends a small first window (initial_codec_chunk_frames) so audio can
start early, then a window every codec_chunk_frames, then the rest with final=True.
full_payload sends the whole code sequence once, when the request finishes.
"""
from __future__ import annotations

import time

import numpy as np

from engine.models.presets import CODEBOOKS
from engine.stage.faults import Injector
from engine.stage.messages import Abort, Frames


class HandoffPolicy:
    def __init__(self, async_chunk: bool, connector):
        self.async_chunk = async_chunk
        self.initial = connector.initial_codec_chunk_frames
        self.chunk = connector.codec_chunk_frames

    def window(self, frames: list[np.ndarray], sent: int, finished: bool, request_id: str) -> Frames | None:
        """The next window to hand off, or None if it is not due yet."""
        n = len(frames)
        if self.async_chunk and not finished:
            due = self.initial if sent == 0 else self.chunk
            if n - sent < due:
                return None
        elif not finished:
            return None
        start = sent if self.async_chunk else 0
        codes = np.stack(frames[start:n]) if n > start else np.zeros((0, CODEBOOKS), dtype=np.int64)
        return Frames(request_id, start, codes, finished)


class Sender:
    """Hands due windows to stage 1, and counts them: frames handed off per request, and handoffs
    begun and done (the watchdog's view of a handoff in progress).  Injected faults act here."""

    def __init__(self, policy: HandoffPolicy, handoff_q, faults: Injector):
        self.policy, self.q, self.faults = policy, handoff_q, faults
        self.sent: dict[str, int] = {}
        self.begun = self.done = 0
        self.request: str | None = None

    def send(self, request_id: str, frames: list[np.ndarray], finished: bool) -> None:
        self.faults.raise_at(len(frames), request_id)
        window = self.policy.window(frames, self.sent.get(request_id, 0), finished, request_id)
        if window is None:
            return
        end = window.start + len(window.codes)
        if not self.faults.drop(end):   # a dropped window is counted as handed off and never delivered
            self.request = request_id
            self.begun += 1
            delay = self.faults.delay_s()
            if delay:
                time.sleep(delay)
            self.q.put(window)
            self.done += 1
        # handed off once delivered: frames still on this side are not stage 1's to wait for
        self.sent[request_id] = end

    def forget(self, request_id: str, abort: bool) -> None:
        self.sent.pop(request_id, None)
        if abort:
            self.q.put(Abort(request_id))
