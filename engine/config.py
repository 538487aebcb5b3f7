"""Deploy profiles: the schema, and resolution with provenance.

A profile is resolved in one order, highest first: explicit overrides, the
platform section, the overlay (`base_config` chain, nearest file wins), the
base, schema defaults.  Resolution works on flat dotted paths
(`stages.0.enforce_eager`, stages keyed by `stage_id`) so that every layer is
a plain dict update and every value can remember where it came from.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from io import StringIO
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import MarkedYAMLError, YAMLError

PLATFORMS = ("cuda", "cpu", "rocm", "npu", "xpu", "musa")
V2_UNSUPPORTED = ("npu", "xpu")
PROFILES_DIR = Path(os.environ.get("LANEKEEPER_PROFILES_DIR", Path(__file__).resolve().parent.parent / "profiles"))

Runner = Literal["v1", "v2"]
Backend = Literal["torch", "vllm"]   # stage 0: the built-in talker, or codebook 0 on vLLM
BACKENDS = get_args(Backend)
Platform = Literal["cuda", "cpu", "rocm", "npu", "xpu", "musa"]


class _Strict(BaseModel):
    # strict: a YAML string "64" is a wrong type, not a number in disguise.
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
    kind: Literal["shared_memory"] = "shared_memory"
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


class StageConfig(_Strict):
    stage_id: int = Field(ge=0, le=1)
    name: str | None = None
    max_num_seqs: int = Field(64, ge=1)
    max_num_batched_tokens: int = Field(512, ge=1)
    max_model_len: int = Field(4096, ge=16)
    enforce_eager: bool = False
    async_scheduling: bool = True
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    devices: str = "0"
    input_connector: str | None = None
    output_connector: str | None = None
    cuda_graph_sizes: list[int] = Field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64])
    default_sampling_params: SamplingParams = Field(default_factory=SamplingParams)


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


class ProfileError(Exception):
    """A profile, override or platform that cannot be resolved; says where."""

    def __init__(self, message: str, path: str | os.PathLike | None = None, key: str | None = None,
                 line: int | None = None):
        self.message, self.path, self.key, self.line = message, path, key, line
        where = str(path) if path else ""
        if path and line:
            where += f":{line}"
        parts = [p for p in (where, key) if p]
        super().__init__(": ".join(parts + [message]))


# ---------------------------------------------------------------- loading

def _yaml() -> YAML:
    y = YAML(typ="rt")
    y.allow_duplicate_keys = False
    return y


def find_profile(name_or_path: str | os.PathLike) -> Path:
    text = str(name_or_path)
    if os.sep in text or text.endswith((".yaml", ".yml")):
        path = Path(text)
    else:
        path = PROFILES_DIR / f"{text}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in PROFILES_DIR.glob("*.yaml") if p.stem != "pins"))
        raise ProfileError(f"no such profile file (known profiles: {known})", path=path)
    return path


def _load_doc(path: Path) -> CommentedMap:
    try:
        doc = _yaml().load(path.read_text())
    except MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark else None
        problem = " ".join(str(x) for x in (e.context, e.problem) if x)
        raise ProfileError(f"YAML syntax error: {problem}", path=path, line=line) from None
    except YAMLError as e:
        raise ProfileError(f"YAML error: {e}", path=path) from None
    if doc is None:
        doc = CommentedMap()
    if not isinstance(doc, dict):
        raise ProfileError(f"expected a mapping at the top level, got {type(doc).__name__}", path=path, line=1)
    return doc


def line_of(doc: Any, loc: tuple) -> int | None:
    """Line (1-based) of the deepest node of `loc` that the YAML document has."""
    line, node = None, doc
    for part in loc:
        if isinstance(node, CommentedMap) and part in node:
            line = node.lc.key(part)[0] + 1
            node = node[part]
        elif isinstance(node, CommentedSeq) and isinstance(part, int) and part < len(node):
            line = node.lc.item(part)[0] + 1
            node = node[part]
        else:
            break
    return line


def _loc_key(doc: Any, loc: tuple) -> str:
    """A readable key path for a pydantic error location: stages[1].max_num_seqs."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif str(part).startswith("function-") or part == "[key]":
            continue
        else:
            out += f".{part}" if out else str(part)
    return out or "<top>"


def _validate_doc(doc: dict, path: Path, model=Profile) -> None:
    try:
        model.model_validate(plain(doc))
    except ValidationError as e:
        err = e.errors()[0]
        loc = tuple(err["loc"])
        msg = err["msg"]
        dup = re.search(r"duplicate stage_id \d+ at index (\d+)", msg)
        if dup:
            loc += (int(dup.group(1)),)
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        elif "input" in err and err["type"] not in ("missing",):
            msg = f"{msg} (got {err['input']!r})" if not isinstance(err["input"], (dict, list)) else msg
        raise ProfileError(msg, path=path, key=_loc_key(doc, loc), line=line_of(doc, loc)) from None


def plain(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [plain(v) for v in node]
    return node


# ------------------------------------------------------------- flattening

def _flatten(node: Any, prefix: str, label, out: dict, skip: tuple = ()) -> None:
    """Flatten a YAML mapping into {dotted path: (value, source)}; stages keyed by stage_id."""
    for key, value in node.items():
        if key in skip:
            continue
        path = f"{prefix}{key}"
        line = node.lc.key(key)[0] + 1 if isinstance(node, CommentedMap) else None
        if key == "stages" and not prefix.count(".") and isinstance(value, list):
            for item in value:
                sid = item["stage_id"]
                for skey, svalue in item.items():
                    if skey == "stage_id":
                        continue
                    sline = item.lc.key(skey)[0] + 1 if isinstance(item, CommentedMap) else None
                    spath = f"stages.{sid}.{skey}"
                    if isinstance(svalue, dict):
                        _flatten(svalue, spath + ".", label, out)
                    else:
                        out[spath] = (plain(svalue), label(sline))
                out.setdefault(f"stages.{sid}", (None, label(item.lc.line + 1 if isinstance(item, CommentedMap) else None)))
        elif isinstance(value, dict) and value:
            _flatten(value, path + ".", label, out)
        elif isinstance(value, dict):
            out.setdefault(path, ({}, label(line)))
        else:
            out[path] = (plain(value), label(line))


def _unflatten(flat: dict[str, Any]) -> dict:
    tree: dict = {}
    stages: dict[int, dict] = {}
    for path, value in flat.items():
        parts = path.split(".")
        if parts[0] == "stages":
            sid = int(parts[1])
            node = stages.setdefault(sid, {"stage_id": sid})
            parts = parts[2:]
            if not parts:
                continue
        else:
            node = tree
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ProfileError(f"{path}: {part} is not a mapping")
        if value == {} and isinstance(node.get(parts[-1]), dict):
            continue
        node[parts[-1]] = value
    if stages:
        tree["stages"] = [stages[s] for s in sorted(stages)]
    return tree


def _flat_model(obj: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in obj.items():
        if key == "stages" and not prefix:
            for stage in value:
                sid = stage["stage_id"]
                out.update(_flat_model({k: v for k, v in stage.items() if k != "stage_id"}, f"stages.{sid}."))
        elif isinstance(value, dict) and value:
            out.update(_flat_model(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


# ------------------------------------------------------------- resolution

@dataclass
class ResolvedProfile:
    name: str
    path: Path
    platform: str
    config: Settings
    sources: dict[str, str] = field(default_factory=dict)
    overrides: tuple[str, ...] = ()

    def flat(self) -> dict[str, Any]:
        return _flat_model(self.config.model_dump())

    def get(self, path: str) -> Any:
        flat = self.flat()
        if path not in flat:
            raise KeyError(path)
        return flat[path]

    def stage(self, stage_id: int) -> StageConfig:
        for stage in self.config.stages:
            if stage.stage_id == stage_id:
                return stage
        raise KeyError(f"profile {self.name} has no stage {stage_id}")

    def connector(self) -> Connector:
        name = self.stage(0).output_connector
        return self.config.connectors[name] if name else Connector()

    @property
    def cell(self) -> str:
        """The matrix cell this profile runs as: runner-graph-handoff."""
        return cell_id(self.config.model_runner, not self.stage(0).enforce_eager, self.config.async_chunk,
                       self.config.backend)

    def explain(self) -> dict[str, dict[str, Any]]:
        return {p: {"value": v, "source": self.sources.get(p, "schema default")} for p, v in self.flat().items()}

    def to_dict(self) -> dict[str, Any]:
        return self.config.model_dump()


def cell_id(runner: str, cuda_graph: bool, async_chunk: bool, backend: str = "torch") -> str:
    """runner-graph-handoff, prefixed by the stage-0 backend when it is not the built-in one."""
    cell = f"{runner}-{'cuda_graph' if cuda_graph else 'no_cuda_graph'}-{'async_chunk' if async_chunk else 'full_payload'}"
    return cell if backend == "torch" else f"{backend}-{cell}"


def parse_override(text: str) -> tuple[str, Any]:
    """`stages.0.enforce_eager=true` -> ("stages.0.enforce_eager", True); values are YAML scalars."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ProfileError(f"malformed override {text!r}: expected KEY=VALUE, e.g. stages.0.enforce_eager=true",
                           key="--set")
    parts = key.split(".")
    if any(not p for p in parts):
        raise ProfileError(f"malformed override {text!r}: empty part in key path {key!r}", key="--set")
    if parts[0] in ("platforms", "base_config"):
        raise ProfileError(f"override {text!r}: {parts[0]} cannot be overridden", key="--set")
    if parts[0] == "stages" and (len(parts) < 3 or not parts[1].isdigit()):
        raise ProfileError(f"malformed override {text!r}: stage keys look like stages.<stage_id>.<key>", key="--set")
    try:
        value = YAML(typ="safe").load(raw) if raw.strip() else ""
    except YAMLError as e:
        raise ProfileError(f"malformed override {text!r}: value is not valid YAML ({e})", key="--set") from None
    return key, value


def detect_platform() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _layers(path: Path, chain: tuple[Path, ...] = ()) -> list[tuple[Path, CommentedMap]]:
    """The base_config chain, base first."""
    path = path.resolve()
    if path in chain:
        cycle = " -> ".join(p.name for p in chain + (path,))
        raise ProfileError(f"base_config cycle: {cycle}", path=chain[-1], key="base_config",
                           line=line_of(_load_doc(chain[-1]), ("base_config",)))
    doc = _load_doc(path)
    _validate_doc(doc, path)
    base = doc.get("base_config")
    if base is None:
        return [(path, doc)]
    base_path = (path.parent / base).resolve()
    if not base_path.is_file():
        raise ProfileError(f"base_config file not found: {base_path}", path=path, key="base_config",
                           line=line_of(doc, ("base_config",)))
    return _layers(base_path, chain + (path,)) + [(path, doc)]


def _rel(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def resolve(name_or_path: str | os.PathLike, platform: str | None = None,
            overrides: list[str] | tuple[str, ...] = ()) -> ResolvedProfile:
    path = find_profile(name_or_path)
    platform = platform or detect_platform()
    if platform not in PLATFORMS:
        raise ProfileError(f"unknown platform {platform!r}; expected one of {', '.join(PLATFORMS)}", key="--platform")

    flat: dict[str, tuple[Any, str]] = {}
    section: dict[str, tuple[Any, str]] = {}
    for file, doc in _layers(path):
        name = _rel(file)
        _flatten(doc, "", lambda line, n=name: f"{n}:{line}" if line else n, flat,
                 skip=("base_config", "platforms"))
        plat = (doc.get("platforms") or {}).get(platform)
        if plat is not None:
            _flatten(plat, "", lambda line, n=name: f"{n}:{line} [platforms.{platform}]", section)
    flat.update(section)
    for text in overrides:
        key, value = parse_override(text)
        if key.startswith("stages.") and f"stages.{key.split('.')[1]}" not in flat:
            raise ProfileError(f"override {text!r}: profile has no stage {key.split('.')[1]}", key="--set")
        flat[key] = (value, f"override --set {text}")

    tree = _unflatten({k: v for k, (v, _) in flat.items()})
    try:
        config = Settings.model_validate(tree)
    except ValidationError as e:
        err = e.errors()[0]
        loc = tuple(err["loc"])
        if loc and loc[0] == "stages" and len(loc) > 1 and isinstance(loc[1], int):
            loc = ("stages", tree["stages"][loc[1]]["stage_id"]) + loc[2:]
        dotted = ".".join(str(p) for p in loc)
        near = [p for p in flat if p == dotted or dotted.startswith(p + ".") or p.startswith(dotted + ".")]
        source = flat[max(near, key=lambda p: (p == dotted, len(p)))][1] if near else ""
        msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
        raise ProfileError(f"{msg} (from {source or 'merged profile'})", path=path, key=dotted) from None

    sources = {k: s for k, (_, s) in flat.items()}
    resolved = ResolvedProfile(name=path.stem, path=path, platform=platform, config=config,
                               sources=sources, overrides=tuple(overrides))
    _check(resolved)
    return resolved


def _check(profile: ResolvedProfile) -> None:
    cfg = profile.config
    if profile.platform in V2_UNSUPPORTED and cfg.model_runner == "v2":
        raise ProfileError(
            f"model_runner v2 is not implemented on {profile.platform} "
            f"(set by {profile.sources.get('model_runner', 'schema default')}); use v1",
            path=profile.path, key="model_runner")
    from engine.faults import FaultSpecError, parse as parse_faults

    try:
        parse_faults(cfg.faults)
    except FaultSpecError as e:
        raise ProfileError(f"{e} (set by {profile.sources.get('faults', 'schema default')})",
                           path=profile.path, key="faults") from None
    ckpt = cfg.model.checkpoint
    if ckpt and not Path(ckpt).is_file():
        raise ProfileError(f"checkpoint file not found: {ckpt} (set by {profile.sources.get('model.checkpoint')})",
                           path=profile.path, key="model.checkpoint")
    ids = sorted(s.stage_id for s in cfg.stages)
    if ids != [0, 1]:
        raise ProfileError(f"expected stages 0 (talker) and 1 (code2wav), got {ids}", path=profile.path, key="stages")
    for stage in cfg.stages:
        for attr in ("input_connector", "output_connector"):
            ref = getattr(stage, attr)
            if ref is not None and ref not in cfg.connectors:
                raise ProfileError(f"connector {ref!r} is not defined under connectors",
                                   path=profile.path, key=f"stages.{stage.stage_id}.{attr}")


def check_file(path: str | os.PathLike) -> list[str]:
    """Errors for one profile file on every platform it supports (empty when valid)."""
    errors: list[str] = []
    try:
        resolved_path = find_profile(path)
        _layers(resolved_path)
    except ProfileError as e:
        return [str(e)]
    for platform in PLATFORMS:
        try:
            resolve(resolved_path, platform=platform)
        except ProfileError as e:
            if platform in V2_UNSUPPORTED and "not implemented" in e.message:
                continue  # a v2 profile without a platform pin is refused there at resolve time, by design
            errors.append(f"[{platform}] {e}")
    return errors


def dump_yaml(data: Any) -> str:
    y = YAML()
    y.default_flow_style = False
    buf = StringIO()
    y.dump(json.loads(json.dumps(data)), buf)
    return buf.getvalue()
