"""The stage side of fault injection: what one stage process asks of the specs it was given."""
from __future__ import annotations

from engine.profile.faults import Fault


class Injector:
    """Should this stage drop, delay, stall, raise or die now?"""

    def __init__(self, faults: list[Fault], stage_id: int):
        # handoff faults act where windows are sent (stage 0); stage faults on their stage
        self.faults = [f for f in faults
                       if (f.kind.endswith("_handoff") and stage_id == 0) or f.get("stage") == stage_id]

    def _of(self, kind):
        return [f for f in self.faults if f.kind == kind]

    def drop(self, frames_end: int) -> bool:
        return any(frames_end > f.get("after_frames") for f in self._of("drop_handoff"))

    def delay_s(self) -> float:
        return sum(f.get("ms") for f in self._of("delay_handoff")) / 1000.0

    def stalled(self, steps: int) -> bool:
        return any(steps >= f.get("after_steps") for f in self._of("stall_stage"))

    def should_die(self, finished_requests: int, frames: int) -> bool:
        for f in self._of("kill_stage"):
            if f.get("after_requests") is not None and finished_requests >= f.get("after_requests"):
                return True
            if f.get("after_frames") is not None and frames >= f.get("after_frames"):
                return True
        return False

    def raise_at(self, frames: int, request_id: str) -> None:
        """An injected exception while handling one request, as a bug on one code path would raise."""
        for f in self._of("raise_stage"):
            if frames >= f.get("after_frames"):
                raise RuntimeError(f"injected fault {f} on request {request_id} at frame {frames}")
