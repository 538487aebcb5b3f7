"""Data that flows between the caller and the stages."""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np

from engine.tokenizer import LANGUAGES, TASK_TYPES, VOICES

_ids = itertools.count()

MAX_INPUT_CHARS = 4096


class RequestError(ValueError):
    """A request the engine refuses before it reaches a stage; `param` names the field."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


@dataclass
class SpeechRequest:
    text: str
    task_type: str = "CustomVoice"
    voice: str | None = "vivian"
    instructions: str | None = None
    ref_audio: np.ndarray | None = None     # mono float32 at ref_sample_rate
    ref_sample_rate: int = 24000
    ref_text: str | None = None
    language: str = "auto"
    seed: int = 0
    temperature: float | None = None        # None: the stage's default_sampling_params
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float | None = None
    max_new_tokens: int | None = None
    request_id: str = field(default_factory=lambda: f"req-{next(_ids)}")

    def validate(self) -> None:
        if not isinstance(self.text, str) or not self.text.strip():
            raise RequestError("input text is empty", "input")
        if len(self.text) > MAX_INPUT_CHARS:
            raise RequestError(f"input is {len(self.text)} characters; at most {MAX_INPUT_CHARS}", "input")
        if self.task_type not in TASK_TYPES:
            raise RequestError(f"unknown task_type {self.task_type!r}; expected one of {', '.join(TASK_TYPES)}",
                               "task_type")
        if self.task_type == "CustomVoice" and (self.voice or "").lower() not in VOICES:
            raise RequestError(f"unknown voice {self.voice!r}; known voices: {', '.join(VOICES)}", "voice")
        if self.task_type == "VoiceDesign" and not (self.instructions or "").strip():
            raise RequestError("VoiceDesign needs instructions describing the voice", "instructions")
        if self.task_type == "Base":
            if self.ref_audio is None or np.asarray(self.ref_audio).size == 0:
                raise RequestError("Base needs ref_audio (reference audio)", "ref_audio")
            if np.asarray(self.ref_audio).ndim != 1:
                raise RequestError("ref_audio must be mono", "ref_audio")
            if not (self.ref_text or "").strip():
                raise RequestError("Base needs ref_text (the transcript of ref_audio)", "ref_text")
        if self.language.lower() not in LANGUAGES:
            raise RequestError(f"unknown language {self.language!r}; known: {', '.join(LANGUAGES)}", "language")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise RequestError("max_new_tokens must be at least 1", "max_new_tokens")
        if self.temperature is not None and self.temperature < 0:
            raise RequestError("temperature must be >= 0", "temperature")


@dataclass
class Frames:
    """A window of codec frames handed from stage 0 to stage 1."""
    request_id: str
    start: int                 # index of the first frame in this window
    codes: np.ndarray          # [n, 16] int64
    final: bool


@dataclass
class AudioChunk:
    request_id: str
    index: int
    audio: np.ndarray          # float32 mono, 24 kHz
    final: bool


@dataclass
class SpeechResult:
    request_id: str
    audio: np.ndarray
    sample_rate: int
    codes: np.ndarray          # [frames, 16]
    status: str                # finished_stopped | finished_length | finished_error | aborted
    timings: dict[str, float] = field(default_factory=dict)
    error: dict | None = None

    @property
    def ok(self) -> bool:
        return self.status.startswith("finished_") and self.status != "finished_error"

    def raise_for_status(self) -> "SpeechResult":
        """Raise the failure (StageHandoffStall, StageStall, StageDied, ...) if the request failed."""
        if self.error is not None:
            from engine.errors import failure

            raise failure(self.error)
        return self

    @property
    def duration_s(self) -> float:
        return len(self.audio) / self.sample_rate
