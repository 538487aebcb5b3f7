"""Deploy profiles: resolution with provenance, against the schema in engine/profile/schema.py.

A profile is resolved in one order, highest first: explicit overrides, the
platform section, the overlay (`base_config` chain, nearest file wins), the
base, schema defaults.  Resolution works on flat dotted paths
(`stages.0.enforce_eager`, stages keyed by `stage_id`) so that every layer is
a plain dict update and every value can remember where it came from.
"""
from __future__ import annotations

import functools
import glob
import json
import os
import sys
from dataclasses import dataclass, field
from io import StringIO
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from engine.errors import did_you_mean
from engine.profile.document import ProfileDoc, flatten, unflatten
from engine.profile.axes import cell_id
from engine.profile.errors import ProfileError, explain_error
from engine.profile.location import profiles_dir
from engine.profile.schema import PLATFORMS, UNREAD, Code2WavStage, Connector, Profile, Settings, TalkerStage

STAGE_ROLES = {0: "talker", 1: "code2wav"}
V2_UNSUPPORTED = ("npu", "xpu")


def find_profile(name_or_path: str | os.PathLike) -> Path:
    text = str(name_or_path)
    directory = profiles_dir()
    if os.sep in text or text.endswith((".yaml", ".yml")):
        path = Path(text)
    else:
        path = directory / f"{text}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in directory.glob("*.yaml") if p.stem != "pins")
        raise ProfileError(f"no such profile file{did_you_mean(text, known)} (known profiles in {directory}: "
                           f"{', '.join(known)})", path=path)
    return path


# ------------------------------------------------------------- resolution

@dataclass
class ResolvedProfile:
    name: str
    path: Path
    platform: str
    config: Settings
    sources: dict[str, str] = field(default_factory=dict)
    overrides: tuple[str, ...] = ()
    runs_on: str | None = None   # where an engine computes, once one started ("cpu" on a CPU fallback)

    def flat(self) -> dict[str, Any]:
        """{dotted path: value} of every resolved setting (the stage_id markers left out)."""
        return {k: leaf.value for k, leaf in flatten(self.config.model_dump()).items()
                if not (k.startswith("stages.") and k.endswith(".stage_id"))}

    def get(self, path: str) -> Any:
        flat = self.flat()
        if path not in flat:
            raise KeyError(path)
        return flat[path]

    def stage(self, stage_id: int) -> TalkerStage | Code2WavStage:
        for stage in self.config.stages:
            if stage.stage_id == stage_id:
                return stage
        raise KeyError(f"profile {self.name} has no stage {stage_id}")

    def stage_name(self, stage_id: int) -> str:
        """What diagnoses call a stage: its `name` in the profile, else its role."""
        return self.stage(stage_id).name or STAGE_ROLES[stage_id]

    def connector(self) -> Connector:
        """The one handoff link (stage 0's output, which is stage 1's input; `_check` holds them equal)."""
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


# Device nodes a GPU torch can see through: NVIDIA's, WSL's and ROCm's.  With none of them no GPU is there, and
# the answer costs no torch import (3 CPU-s, and more at exit), which every lane's pytest and client would pay.
GPU_NODES = ("/dev/nvidia[0-9]*", "/dev/dxg", "/dev/kfd")


def detect_platform() -> str:
    if "torch" not in sys.modules and not any(glob.glob(node) for node in GPU_NODES):
        return "cpu"
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _layers(path: Path, chain: tuple[Path, ...] = ()) -> list[tuple[Path, ProfileDoc]]:
    """The base_config chain, base first; each file checked on its own before any merging."""
    path = path.resolve()
    if path in chain:
        cycle = " -> ".join(p.name for p in chain + (path,))
        raise ProfileError(f"base_config cycle: {cycle}", path=chain[-1], key="base_config",
                           line=ProfileDoc.load(chain[-1]).line("base_config"))
    doc = ProfileDoc.load(path)
    doc.flat()                 # stages keyed by a unique integer stage_id, before the schema speaks
    doc.validate(Profile)
    base = doc.data.get("base_config")
    if base is None:
        return [(path, doc)]
    base_path = (path.parent / base).resolve()
    if not base_path.is_file():
        raise ProfileError(f"base_config file not found: {base_path}", path=path, key="base_config",
                           line=doc.line("base_config"))
    return _layers(base_path, chain + (path,)) + [(path, doc)]


def layer_files(name_or_path: str | os.PathLike) -> list[Path]:
    """The files a profile resolves from, base first."""
    return [file for file, _ in _layers(find_profile(name_or_path))]


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

    flat: dict[str, tuple[Any, str]] = {}       # path -> (value, where it came from)
    section: dict[str, tuple[Any, str]] = {}
    for file, doc in _layers(path):
        name = _rel(file)
        for key, leaf in doc.flat().items():
            where = f"{name}:{leaf.line}" if leaf.line else name
            top, _, rest = key.partition(".")
            if top == "base_config":
                continue
            if top == "platforms":
                plat, _, rest = rest.partition(".")
                if plat == platform and rest:
                    section[rest] = (leaf.value, f"{where} [platforms.{platform}]")
            else:
                flat[key] = (leaf.value, where)
    flat.update(section)
    for text in overrides:
        key, value = parse_override(text)
        if key.startswith("stages.") and f"stages.{key.split('.')[1]}.stage_id" not in flat:
            raise ProfileError(f"override {text!r}: profile has no stage {key.split('.')[1]}", key="--set")
        flat[key] = (value, f"override --set {text}")

    tree = unflatten({k: v for k, (v, _) in flat.items()})
    try:
        config = Settings.model_validate(tree)
    except ValidationError as e:
        dotted, _, msg = explain_error(e, tree, Settings)
        near = [p for p in flat if p == dotted or dotted.startswith(p + ".") or p.startswith(dotted + ".")]
        source = flat[max(near, key=lambda p: (p == dotted, len(p)))][1] if near else ""
        raise ProfileError(f"{msg} (from {source or 'merged profile'})", path=path, key=dotted) from None

    sources = {k: s for k, (_, s) in flat.items()}
    resolved = ResolvedProfile(name=path.stem, path=path, platform=platform, config=config,
                               sources=sources, overrides=tuple(overrides))
    _check(resolved)
    return resolved


class RunnerUnsupported(ProfileError):
    """A platform that refuses the profile's runner by design (v2 on npu and xpu): not a broken profile."""


@functools.cache
def _defaults() -> dict:
    """Every setting's schema default, by dotted path."""
    return flatten(Settings(stages=[TalkerStage(stage_id=0), Code2WavStage(stage_id=1)]).model_dump())


def _unread(profile: ResolvedProfile) -> None:
    """A setting the backend does not read, set to something else than its default, is refused."""
    defaults, flat = _defaults(), profile.flat()
    for key in UNREAD[profile.config.backend]:
        if flat[key] != defaults[key].value:
            raise ProfileError(f"backend {profile.config.backend} does not read {key}, so {flat[key]!r} (set by "
                               f"{profile.sources.get(key, 'schema default')}) would do nothing; leave it at "
                               f"{defaults[key].value!r} or use a backend that reads it", path=profile.path, key=key)


def _check(profile: ResolvedProfile) -> None:
    cfg = profile.config
    _unread(profile)
    if profile.platform in V2_UNSUPPORTED and cfg.model_runner == "v2":
        raise RunnerUnsupported(
            f"model_runner v2 is not implemented on {profile.platform} "
            f"(set by {profile.sources.get('model_runner', 'schema default')}); use v1",
            path=profile.path, key="model_runner")
    from engine.profile.faults import FaultSpecError, parse as parse_faults

    try:
        faults = parse_faults(cfg.faults)
    except FaultSpecError as e:
        raise ProfileError(f"{e} (set by {profile.sources.get('faults', 'schema default')})",
                           path=profile.path, key="faults") from None
    known = profile.flat()
    for key in (key for fault in faults for key, _ in fault.when if key not in known):
        raise ProfileError(f"a fault's when={key}:...: the profile has no key {key}{did_you_mean(key, known)} "
                           f"(set by {profile.sources.get('faults', 'schema default')})", path=profile.path,
                           key="faults")
    ckpt = cfg.model.checkpoint
    if ckpt and not Path(ckpt).is_file():
        raise ProfileError(f"checkpoint file not found: {ckpt} (set by {profile.sources.get('model.checkpoint')})",
                           path=profile.path, key="model.checkpoint")
    ids = sorted(s.stage_id for s in cfg.stages)
    if ids != [0, 1]:
        raise ProfileError(f"expected stages 0 (talker) and 1 (code2wav), got {ids}", path=profile.path, key="stages")
    links = {"stages.0.output_connector": profile.stage(0).output_connector,
             "stages.1.input_connector": profile.stage(1).input_connector}
    for key, ref in links.items():
        if ref is not None and ref not in cfg.connectors:
            raise ProfileError(f"connector {ref!r} is not defined under connectors (set by "
                               f"{profile.sources.get(key, 'schema default')})", path=profile.path, key=key)
    if len(set(links.values())) > 1:
        raise ProfileError(f"stage 1 reads from connector {links['stages.1.input_connector']!r} but stage 0 writes "
                           f"to {links['stages.0.output_connector']!r}; the handoff is one link, so both must "
                           f"name the same connector", path=profile.path, key="stages.1.input_connector")


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
        except RunnerUnsupported:
            continue  # a v2 profile without a platform pin is refused there at resolve time, by design
        except ProfileError as e:
            errors.append(f"[{platform}] {e}")
    return errors


def dump_yaml(data: Any) -> str:
    y = YAML()
    y.default_flow_style = False
    buf = StringIO()
    y.dump(json.loads(json.dumps(data)), buf)
    return buf.getvalue()
