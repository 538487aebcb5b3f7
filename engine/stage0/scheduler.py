"""Which requests stage 0 runs: admission within max_num_seqs and the step's prompt budget, finishing,
aborts.  It computes nothing; the backend does (see backend.py)."""
from __future__ import annotations

from collections import deque

from engine.stage0.model_runner import Sequence


class Scheduler:
    def __init__(self, max_num_seqs: int, max_num_batched_tokens: int, in_flight_tokens=lambda seq: 0):
        self.max_seqs, self.budget = max_num_seqs, max_num_batched_tokens
        self.in_flight_tokens = in_flight_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def depth(self) -> int:
        return len(self.waiting) + len(self.running)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def schedule(self) -> list[Sequence]:
        """The waiting requests that start this step.  The first one always starts when no running
        request holds any of the budget, so a prompt longer than the budget still runs, alone."""
        budget = self.budget - sum(self.in_flight_tokens(s) for s in self.running)
        held = budget < self.budget
        admitted: list[Sequence] = []
        while self.waiting and len(self.running) + len(admitted) < self.max_seqs:
            n = self.waiting[0].prompt.shape[0]
            if n > budget and (admitted or held):
                break
            admitted.append(self.waiting.popleft())
            budget -= n
        self.running += admitted
        return admitted

    def finish(self, seq: Sequence) -> None:
        self.running.remove(seq)

    def remove(self, request_id: str) -> list[Sequence]:
        """Take a request out wherever it is; the running ones it was are returned, for their release."""
        self.waiting = deque(s for s in self.waiting if s.request_id != request_id)
        gone = [s for s in self.running if s.request_id == request_id]
        self.running = [s for s in self.running if s.request_id != request_id]
        return gone
