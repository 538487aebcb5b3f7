"""Errors in a profile (or any YAML document validated against a schema here), said as
`file:line: key: message`, with the key as the document's dotted path."""
from __future__ import annotations

import os
import types
import typing
from typing import Any

from pydantic import BaseModel, ValidationError
from ruamel.yaml.comments import CommentedMap, CommentedSeq

from engine.errors import UserError, did_you_mean


class ProfileError(UserError):
    """A profile, override or platform that cannot be resolved; says where."""

    def __init__(self, message: str, path: str | os.PathLike | None = None, key: str | None = None,
                 line: int | None = None):
        self.message, self.path, self.key, self.line = message, path, key, line
        where = str(path) if path else ""
        if path and line:
            where += f":{line}"
        parts = [p for p in (where, key) if p]
        super().__init__(": ".join(parts + [message]))


def key_line(node: Any, key: Any) -> int | None:
    return node.lc.key(key)[0] + 1 if isinstance(node, CommentedMap) and key in node else None


def locate(data: Any, loc: tuple) -> tuple[str, int | None]:
    """A pydantic error location as (dotted key, line).  A list item is addressed by its index
    (`lanes.2.timeout`), a stage by its stage_id (`stages.0.max_num_seqs`), and a stage without a
    unique one by its place (`stages[2]`)."""
    key: list[str] = []
    line, node = None, data
    for part in loc:
        if isinstance(part, str) and (part.startswith("function-") or part == "[key]"):
            continue
        if isinstance(node, list) and isinstance(part, int) and part < len(node):
            if key and key[-1] == "stages":
                sids = [i.get("stage_id") if isinstance(i, dict) else None for i in node]
                sid = sids[part]
                if isinstance(sid, int) and not isinstance(sid, bool) and sids.count(sid) == 1:
                    key.append(str(sid))
                else:
                    key[-1] += f"[{part}]"
            else:
                key.append(str(part))
            if isinstance(node, CommentedSeq):
                line = node.lc.item(part)[0] + 1
            node = node[part]
        elif isinstance(node, dict) and str(part) in node and not (key and key[-1].split("[")[0] == "stages"
                                                                   and str(part) == str(node.get("stage_id"))):
            key.append(str(part))
            line = key_line(node, str(part)) or line
            node = node[str(part)]
        elif isinstance(node, dict) and str(part) == str(node.get("stage_id")):
            continue            # the tag of the stage union: already in the key
        else:
            key.append(str(part))
            node = None
    return ".".join(key) or "<top>", line


def _unwrap(tp):
    """The type an annotation stands for: Annotated and Optional stripped."""
    while True:
        origin = typing.get_origin(tp)
        if origin is typing.Annotated:
            tp = typing.get_args(tp)[0]
        elif origin in (typing.Union, types.UnionType):
            members = [a for a in typing.get_args(tp) if a is not type(None)]
            if len(members) != 1:
                return tp
            tp = members[0]
        else:
            return tp


def _step(tp, part):
    """The type found at `part` inside `tp` (a field, a list item, a dict value, a union member by its tag)."""
    tp = _unwrap(tp)
    origin = typing.get_origin(tp)
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        field = tp.model_fields.get(part) if isinstance(part, str) else None
        return field.annotation if field else None
    if origin is list:
        return typing.get_args(tp)[0]
    if origin is dict:
        return typing.get_args(tp)[1]
    if origin in (typing.Union, types.UnionType):
        for member in typing.get_args(tp):
            if isinstance(member, type) and issubclass(member, BaseModel) and any(
                    part in typing.get_args(f.annotation) for f in member.model_fields.values()
                    if typing.get_origin(f.annotation) is typing.Literal):
                return member
    return None


def keys_at(model: type[BaseModel], loc: tuple) -> list[str]:
    """The keys the schema allows where `loc` (a pydantic error location) puts an unknown one."""
    tp = model
    for part in loc[:-1]:
        tp = _step(tp, part)
        if tp is None:
            return []
    tp = _unwrap(tp)
    return list(tp.model_fields) if isinstance(tp, type) and issubclass(tp, BaseModel) else []


def unknown_key(key: str, allowed: list[str], where: str) -> str:
    """"unknown key", with the nearest allowed key and every key allowed there."""
    return f"unknown key{did_you_mean(key, allowed)} ({where or 'the top level'} takes: {', '.join(allowed)})" if allowed \
        else "unknown key"


def explain_error(e: ValidationError, data: Any, model: type[BaseModel] | None = None) -> tuple[str, int | None, str]:
    """(key, line, message) for the first error of a validation, in the words of the document; an unknown
    key is told with the nearest key `model` allows there, and all of them."""
    err = e.errors()[0]
    key, line = locate(data, tuple(err["loc"]))
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        parent = key.rpartition(".")[0]
        msg = unknown_key(str(err["loc"][-1]), keys_at(model, tuple(err["loc"])) if model else [], parent)
    elif err["type"] != "missing" and "input" in err and not isinstance(err["input"], (dict, list)):
        msg = f"{msg} (got {err['input']!r})"
    return key, line, msg


def format_error(e: ValidationError, data: Any, path: str | os.PathLike, model: type[BaseModel] | None = None) -> str:
    """`file:line: key: message`, the one shape every schema error takes here."""
    key, line, msg = explain_error(e, data, model)
    return f"{path}{f':{line}' if line else ''}: {key}: {msg}"
