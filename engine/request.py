"""Data that flows between the caller and the stages."""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np

from engine.diagnosis import Diagnosis
from engine.errors import UserError
from engine.models.tokenizer import LANGUAGES, TASK_TYPES, VOICES

_ids = itertools.count()

MAX_INPUT_CHARS = 4096          # input, instructions and ref_text each
MAX_SEED = 2**63 - 1            # a torch.Generator seed is a signed 64-bit integer
MAX_TEMPERATURE = 10.0          # past this every code is about equally likely; far past it softmax overflows
MAX_TOP_K = 2048                # the codebook size
MAX_REPETITION_PENALTY = 10.0
MAX_NEW_TOKENS = 65536          # a bound of the type; the stage's max_model_len is the real one


class RequestError(UserError, ValueError):
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
        for name in ("instructions", "ref_text"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or len(value) > MAX_INPUT_CHARS):
                size = f"{len(value)} characters" if isinstance(value, str) else f"a {type(value).__name__}"
                raise RequestError(f"{name} is {size}; at most {MAX_INPUT_CHARS} characters", name)
        _in_range("seed", self.seed, 0, MAX_SEED, integer=True)
        _in_range("max_new_tokens", self.max_new_tokens, 1, MAX_NEW_TOKENS, integer=True)
        _in_range("top_k", self.top_k, 0, MAX_TOP_K, integer=True)
        _in_range("temperature", self.temperature, 0.0, MAX_TEMPERATURE)
        _in_range("repetition_penalty", self.repetition_penalty, 1e-6, MAX_REPETITION_PENALTY)
        if self.top_p is not None:
            _in_range("top_p", self.top_p, 1e-6, 1.0)


def _in_range(name: str, value, low, high, integer: bool = False) -> None:
    """None passes (the stage's default); otherwise a finite number of the right kind within [low, high]."""
    if value is None:
        return
    kinds = (int, np.integer) if integer else (int, float, np.integer, np.floating)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, kinds):
        raise RequestError(f"{name} must be {'an integer' if integer else 'a number'}, got {value!r}", name)
    if not math.isfinite(value) or not low <= value <= high:
        raise RequestError(f"{name} must be between {low:g} and {high:g}, got {value!r}", name)


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
    error: Diagnosis | None = None

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
