"""Fault specs, so that the watchdog itself is tested.  Off unless asked for; `engine.stage.faults`
injects them inside the stages.

Specs come from the profile's `faults:` list or `LANEKEEPER_FAULTS` (specs joined by ';'):

    drop_handoff:after_frames=10          stage 0 stops delivering windows once a request has 10 frames
    delay_handoff:ms=500                  every handoff window is delivered 500 ms late
    stall_stage:stage=0,after_steps=5     the stage stops making progress (it keeps its heartbeat)
    kill_stage:stage=1,after_requests=1   the stage exits once it has finished 1 request
    kill_stage:stage=1,after_frames=5     ... or once it has handled 5 frames
    raise_stage:stage=1,after_frames=20   the stage raises while handling a request that has reached 20 frames
                                          (the request fails; the stage must go on)

Any spec may add `when=KEY:VALUE` (repeatable; all must hold): it acts only where the resolved profile
sets KEY to VALUE, and is inert elsewhere.  `drop_handoff:after_frames=10,when=model_runner:v2` is a
defect of runner v2, so a profile can carry it and a flip of the default really turns a lane red.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from engine.errors import UserError

WHEN = "when"

ENV = "LANEKEEPER_FAULTS"

KINDS: dict[str, dict[str, tuple[type, object]]] = {
    # kind: {param: (type, default)}; a default of None means required
    "drop_handoff": {"after_frames": (int, 0)},
    "delay_handoff": {"ms": (int, None)},
    "stall_stage": {"stage": (int, None), "after_steps": (int, 0)},
    "kill_stage": {"stage": (int, None), "after_requests": (int, None), "after_frames": (int, None)},
    "raise_stage": {"stage": (int, None), "after_frames": (int, None)},
}


class FaultSpecError(UserError, ValueError):
    pass


@dataclass(frozen=True)
class Fault:
    kind: str
    params: tuple[tuple[str, int], ...]
    when: tuple[tuple[str, object], ...] = ()   # (resolved key, value) that must all hold for it to act

    def get(self, name: str, default=None):
        return dict(self.params).get(name, default)

    def applies(self, resolved: dict) -> bool:
        """Whether it acts under these resolved values (`ResolvedProfile.flat()`)."""
        return all(key in resolved and resolved[key] == value for key, value in self.when)

    def __str__(self) -> str:
        return f"{self.kind}:" + ",".join([f"{k}={v}" for k, v in self.params] +
                                          [f"{WHEN}={k}:{_text(v)}" for k, v in self.when])


def _text(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _condition(text: str, spec: str, where: str) -> tuple[str, object]:
    from ruamel.yaml import YAML

    key, colon, value = text.partition(":")
    if not colon or not key or not value:
        raise FaultSpecError(f"{where}: {WHEN}={text!r} in {spec!r} is not KEY:VALUE (e.g. when=model_runner:v2)")
    return key, YAML(typ="safe").load(value)


def parse_one(spec: str, where: str) -> Fault:
    kind, _, rest = spec.strip().partition(":")
    if kind not in KINDS:
        raise FaultSpecError(f"{where}: unknown fault {kind!r} in {spec!r}; known: {', '.join(KINDS)}")
    allowed = KINDS[kind]
    params, when = {}, []
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = part.partition("=")
        if key == WHEN and eq:
            when.append(_condition(value, spec, where))
            continue
        if not eq or key not in allowed:
            raise FaultSpecError(f"{where}: bad parameter {part!r} in {spec!r}; {kind} takes "
                                 f"{', '.join(f'{k}=N' for k in allowed)} and {WHEN}=KEY:VALUE")
        try:
            params[key] = allowed[key][0](value)
        except ValueError:
            raise FaultSpecError(f"{where}: {key} must be an integer in {spec!r}, got {value!r}") from None
        if params[key] < 0:
            raise FaultSpecError(f"{where}: {key} must be >= 0 in {spec!r}")
    for key, (_, default) in allowed.items():
        if key not in params and default is not None:
            params[key] = default
    required = [k for k, (_, d) in allowed.items() if d is None and k not in params]
    if kind == "kill_stage":
        if "after_requests" not in params and "after_frames" not in params:
            raise FaultSpecError(f"{where}: kill_stage needs after_requests=N or after_frames=N in {spec!r}")
        required = [k for k in required if k == "stage"]
    if required:
        raise FaultSpecError(f"{where}: {kind} needs {', '.join(f'{k}=N' for k in required)} in {spec!r}")
    if "stage" in params and params["stage"] not in (0, 1):
        raise FaultSpecError(f"{where}: stage must be 0 or 1 in {spec!r}")
    return Fault(kind, tuple(sorted(params.items())), tuple(when))


def parse(specs: list[str] | str, where: str = "faults") -> list[Fault]:
    if isinstance(specs, str):
        specs = [s for s in specs.split(";") if s.strip()]
    return [parse_one(s, where) for s in specs]


def from_env() -> list[Fault]:
    return parse(os.environ.get(ENV, ""), where=ENV)
