"""Errors.  `UserError` is everything a user can fix (a profile, a flag, a file, a request):
`lanekeeper` prints it in one line and exits 2.  A failed request raises `RequestFailed` carrying its
`Diagnosis`; the stall kinds have classes of their own so that callers can catch exactly them."""
from __future__ import annotations

import difflib

from engine.diagnosis import WATCHDOG_KINDS, Diagnosis


class UserError(Exception):
    """Bad input, said in words that name what and where."""


def did_you_mean(word: str, choices) -> str:
    """"; did you mean X?" for the nearest of `choices`, or "" when none is near: the suggestion every
    "unknown ..." error carries."""
    near = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {near[0]}?" if near else ""


class EngineError(RuntimeError):
    def __init__(self, message: str, detail: str | None = None):
        super().__init__(message)
        self.detail = detail   # the stage's traceback, when there is one


class RequestFailed(EngineError):
    def __init__(self, diagnosis: Diagnosis):
        super().__init__(diagnosis.message)
        self.diagnosis = diagnosis


class StageHandoffStall(RequestFailed):
    """Stage 1 waited for frames that stage 0 produced or finished but that never arrived."""


class StageStall(RequestFailed):
    """A stage had work and made no progress (or stopped sending heartbeats)."""


class StageDied(RequestFailed):
    """A stage process exited."""


_STALLS = {cls.__name__: cls for cls in (StageHandoffStall, StageStall, StageDied)}
assert set(_STALLS) == set(WATCHDOG_KINDS)


def failure(diagnosis: Diagnosis) -> RequestFailed:
    """The exception that matches a diagnosis."""
    return _STALLS.get(diagnosis.kind, RequestFailed)(diagnosis)
