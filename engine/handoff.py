"""The stage-0 side of the handoff: when to send which frames to stage 1.

async_chunk sends a small first window (initial_codec_chunk_frames) so audio can
start early, then a window every codec_chunk_frames, then the rest with final=True.
full_payload sends the whole code sequence once, when the request finishes.
"""
from __future__ import annotations

import numpy as np

from engine.presets import CODEBOOKS
from engine.messages import Frames


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
