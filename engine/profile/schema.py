"""The deploy profile schema: what a profile, and each of its platform sections, may set.

Strict: a YAML string "64" is a wrong type, not a number in disguise, and an unknown key is an
error.  `engine/profile/resolve.py` resolves profiles against it; `engine/profile/pins.py` pins what it resolves.
"""
from __future__ import annotations

from typing import Annotated, Literal, Union, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator

Runner = Literal["v1", "v2"]
Backend = Literal["torch", "vllm"]   # stage 0: the built-in talker, or codebook 0 on vLLM
BACKENDS = get_args(Backend)
# Settings a backend does not read: a profile may leave them at the schema default, and is refused if
# it sets anything else there, since the value would do nothing.
UNREAD: dict[str, tuple[str, ...]] = {"torch": ("stages.0.async_scheduling",), "vllm": ()}
Platform = Literal["cuda", "cpu", "rocm", "npu", "xpu", "musa"]
PLATFORMS = get_args(Platform)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class SamplingParams(_Strict):
    temperature: float = Field(0.9, ge=0)
    top_k: int = Field(50, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    repetition_penalty: float = Field(1.0, gt=0)
    min_tokens: int = Field(2, ge=0)
    max_tokens: int = Field(2048, ge=1)
    stop_token_ids: list[int] = Field(default_factory=lambda: [2150])


class Connector(_Strict):
    """The stage-0 -> stage-1 link: how frames are windowed on their way to code2wav."""

    codec_chunk_frames: int = Field(25, ge=1)
    codec_left_context_frames: int = Field(72, ge=0)
    initial_codec_chunk_frames: int = Field(1, ge=1)


class Watchdog(_Strict):
    enabled: bool = True
    heartbeat_interval_s: float = Field(0.5, gt=0)
    handoff_deadline_s: float = Field(30.0, gt=0)
    stage_deadline_s: float = Field(60.0, gt=0)


class ModelConfig(_Strict):
    preset: Literal["tiny", "0.6b"] = "tiny"
    seed: int = 0
    checkpoint: str | None = None
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"


class TalkerStage(_Strict):
    """Stage 0: the autoregressive talker, the only stage that batches, caches and samples."""

    stage_id: Literal[0]
    name: str | None = None       # what diagnoses call the stage (default: its role)
    max_num_seqs: int = Field(64, ge=1)
    max_num_batched_tokens: int = Field(512, ge=1)
    max_model_len: int = Field(4096, ge=16)
    enforce_eager: bool = False
    async_scheduling: bool = True
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    devices: str = "0"
    output_connector: str | None = None
    cuda_graph_sizes: list[int] = Field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64])
    default_sampling_params: SamplingParams = Field(default_factory=SamplingParams)


class Code2WavStage(_Strict):
    """Stage 1: decodes the handed-off windows on its device, batched, with CUDA graphs when stage 0 has
    them (stages.0.enforce_eager is the engine's graph mode)."""

    stage_id: Literal[1]
    name: str | None = None
    devices: str = "0"
    input_connector: str | None = None
    # how long a codec pass may wait for more windows while other streams are open (never for a stream's
    # first window): a pass's fixed part is paid once however many windows it holds
    max_batch_wait_ms: float = Field(20.0, ge=0, le=1000)


StageConfig = Annotated[Union[TalkerStage, Code2WavStage], Field(discriminator="stage_id")]


class Settings(_Strict):
    """What a profile, and each of its platform sections, may set."""

    model_runner: Runner = "v1"
    async_chunk: bool = True
    backend: Backend = "torch"
    model: ModelConfig = Field(default_factory=ModelConfig)
    connectors: dict[str, Connector] = Field(default_factory=dict)
    watchdog: Watchdog = Field(default_factory=Watchdog)
    faults: list[str] = Field(default_factory=list)
    stages: list[StageConfig] = Field(default_factory=list)

    @field_validator("faults", mode="before")
    @classmethod
    def _faults_string(cls, value):
        """`--set faults=drop_handoff:after_frames=3` (specs joined by ';') as well as a list."""
        return [s.strip() for s in value.split(";") if s.strip()] if isinstance(value, str) else value

    @field_validator("stages")
    @classmethod
    def _unique_stage_ids(cls, stages):
        seen = set()
        for i, stage in enumerate(stages):
            if stage.stage_id in seen:
                raise ValueError(f"duplicate stage_id {stage.stage_id} at index {i}")
            seen.add(stage.stage_id)
        return stages


class Profile(Settings):
    base_config: str | None = None
    platforms: dict[Platform, Settings] = Field(default_factory=dict)
