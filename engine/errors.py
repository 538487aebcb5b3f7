"""Engine errors.  A failed request carries a structured diagnosis (`.error`), and the
stall kinds have their own classes so that tests and callers can catch exactly them."""
from __future__ import annotations


class EngineError(RuntimeError):
    def __init__(self, message: str, detail: str | None = None):
        super().__init__(message)
        self.detail = detail   # the stage's traceback, when there is one


class RequestFailed(EngineError):
    def __init__(self, error: dict):
        super().__init__(error.get("message", str(error)))
        self.error = error


class StageHandoffStall(RequestFailed):
    """Stage 1 waited for frames that stage 0 produced or finished but that never arrived."""


class StageStall(RequestFailed):
    """A stage had work and made no progress (or stopped sending heartbeats)."""


class StageDied(RequestFailed):
    """A stage process exited."""


WATCHDOG_KINDS = {cls.__name__: cls for cls in (StageHandoffStall, StageStall, StageDied)}


def failure(error: dict) -> RequestFailed:
    """The exception class that matches a diagnosis."""
    return WATCHDOG_KINDS.get(error.get("kind"), RequestFailed)(error)
