"""What stage 0 asks of a backend: compute one step for the batch the scheduler gives it.

The scheduler (`scheduler.py`) decides which requests run; a backend only computes them.  The built-in
talker (`torch_backend.py`, runner v1 or v2) and vLLM (`vllm_backend.py`) implement this interface;
neither sees the handoff, the fault injector or the other requests' bookkeeping.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass, field

import numpy as np

from engine.stage0.model_runner import Sequence


@dataclass
class Produced:
    """What one step made of one request: its new frames (codebooks 0..15 each) and whether its
    generation ended (a stop token, its length, or the backend's own end)."""
    frames: list[np.ndarray] = field(default_factory=list)
    finished: bool = False


class Backend(abc.ABC):
    name: str
    models: object            # the talker (prompt embeddings) and code predictor, built from the preset
    capacity: int             # KV positions one request may use: its prompt and frames
    synthetic: bool           # weights with no sense of length: a request stops at its text's length

    @abc.abstractmethod
    def info(self) -> dict:
        """What stage 0 reports with its ready message."""

    def refusal(self, seq: Sequence) -> str | None:
        """Why this request can never run here (None when it can); checked when it arrives."""
        return None

    def in_flight_tokens(self, seq: Sequence) -> int:
        """Prompt tokens a running request still holds of a step's budget (max_num_batched_tokens)."""
        return 0

    @abc.abstractmethod
    def admit(self, seqs: list[Sequence]) -> None:
        """Take these requests into the running batch (slots, prefill)."""

    @abc.abstractmethod
    def execute(self, seqs: list[Sequence], clock) -> dict[str, Produced]:
        """One step of the running batch: what it produced, by request id.  The step's time goes to
        `clock`'s parts "decode" (computing) and "readback" (waiting for the device's results)."""

    @abc.abstractmethod
    def release(self, seq: Sequence) -> None:
        """The request left the batch (finished, failed or aborted): free what it held."""

    def close(self) -> None:
        """Release what lives outside this process."""
