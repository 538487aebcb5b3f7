"""Why a request failed, or why an engine cannot serve any more: one model, made by the engine and
its watchdog and read back unchanged by the server, the test plugin, the JUnit file, the stall
report and `lanekeeper report`.

Each of those serialises it as JSON (`to_json`, `model_dump`) and reads it back with
`Diagnosis.model_validate(_json)`, so a field means the same wherever it is seen; `message` is
what people read.
"""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict

# Kinds the watchdog diagnoses: a test that fails with one of these (or a pytest-timeout) stalled.
WATCHDOG_KINDS = ("StageHandoffStall", "StageStall", "StageDied")
TIMEOUT = "Timeout"


class Diagnosis(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str                       # StageHandoffStall, StageStall, StageDied, StageError, StageCrashed,
                                    # RequestFailed, Aborted, EngineClosed, Timeout
    message: str                    # in words, starting with the kind
    stage: int | None = None
    stage_name: str | None = None
    request_id: str | None = None
    request_ids: tuple[str, ...] = ()   # every request the same stall failed
    frames_produced: int | None = None
    frames_handed_off: int | None = None
    frames_consumed: int | None = None
    seconds_since_progress: float | None = None   # or since the stage was last heard from
    seconds_since_submit: float | None = None
    exitcode: int | None = None     # of a dead stage
    profile: str | None = None
    cell: str | None = None         # the matrix cell the engine's profile makes
    traceback: str | None = None    # of a stage's exception: logs only, never a response body

    @property
    def stall(self) -> bool:
        """A stall: the watchdog's diagnoses and pytest-timeout's."""
        return self.kind in WATCHDOG_KINDS or self.kind == TIMEOUT

    def public(self) -> dict:
        """The fields a client may see: everything but the traceback, and nothing unset."""
        return self.model_dump(mode="json", exclude={"traceback"}, exclude_none=True, exclude_defaults=True) | \
            {"kind": self.kind, "message": self.message}

    def for_request(self, request_id: str) -> "Diagnosis":
        return self.model_copy(update={"request_id": request_id})
