"""A deploy profile as one path-addressed document.

Resolution, `--explain`, the pins, rollback and the lanes loader all speak of a value by
the same dotted path: `model_runner`, `connectors.shm.codec_chunk_frames`,
`stages.0.max_num_batched_tokens` (a stage by its `stage_id`, never by its place in the
list), `platforms.rocm.model_runner`.  So nothing downstream depends on the order, the
comments or the line numbers of a file, and an edit (`set`) is a ruamel round trip that
keeps every comment.
"""
from __future__ import annotations

import copy
import functools
import os
from dataclasses import dataclass
from io import StringIO
from pathlib import Path
from typing import Any, Mapping

from pydantic import ValidationError
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.constructor import DuplicateKeyError
from ruamel.yaml.error import MarkedYAMLError, YAMLError

from engine.profile.errors import ProfileError, explain_error, key_line

MISSING = type("Missing", (), {"__repr__": lambda self: "<absent>", "__bool__": lambda self: False})()


@dataclass(frozen=True)
class Leaf:
    value: Any
    line: int | None = None   # 1-based; None for values that came from no file


def plain(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [plain(v) for v in node]
    return node


def _yaml() -> YAML:
    y = YAML(typ="rt")
    y.allow_duplicate_keys = False
    y.indent(mapping=2, sequence=4, offset=2)
    y.preserve_quotes = True
    y.width = 4096
    return y


@functools.lru_cache(maxsize=256)
def _parse(text: str) -> Any:
    """One round-trip parse per distinct text: resolving every profile on every platform (the pins,
    rollback's isolation) reads the same few files hundreds of times, and the pure-Python round-trip
    parser costs about six times the deep copy each caller gets of it."""
    return _yaml().load(text)


def _stage_id(item: Any, where: str) -> int:
    sid = item.get("stage_id") if isinstance(item, dict) else None
    if not isinstance(sid, int) or isinstance(sid, bool):
        raise ProfileError(f"each entry of {where} needs an integer stage_id, got {sid!r}", key=where,
                           line=item.lc.line + 1 if isinstance(item, CommentedMap) else None)
    return sid


def flatten(node: Mapping, prefix: str = "", skip: tuple = ()) -> dict[str, Leaf]:
    """{dotted path: Leaf}.  A `stages` list is keyed by stage_id, and each stage keeps a
    `stages.N.stage_id` leaf so that a stage with nothing else set still exists."""
    out: dict[str, Leaf] = {}
    for key, value in node.items():
        if key in skip:
            continue
        path = f"{prefix}{key}"
        if key == "stages" and isinstance(value, list):
            for i, item in enumerate(value):
                sid = _stage_id(item, path)
                line = item.lc.line + 1 if isinstance(item, CommentedMap) else None
                if f"{path}.{sid}.stage_id" in out:
                    raise ProfileError(f"duplicate stage_id {sid}", key=f"{path}[{i}]", line=line)
                out[f"{path}.{sid}.stage_id"] = Leaf(sid, line)
                out.update(flatten(item, f"{path}.{sid}.", skip=("stage_id",)))
        elif isinstance(value, dict) and value:
            out.update(flatten(value, path + "."))
        else:
            out[path] = Leaf(plain(value), key_line(node, key))
    return out


def unflatten(flat: Mapping[str, Any]) -> dict:
    """The nested document for {dotted path: value}; stages become a list sorted by stage_id."""
    tree: dict = {}
    for path, value in flat.items():
        node, parts = tree, path.split(".")
        for i, part in enumerate(parts[:-1]):
            if i > 0 and parts[i - 1] == "stages" and part.isdigit():
                part = int(part)
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ProfileError(f"{'.'.join(parts[:i + 1])} is not a mapping", key=path)
        last = parts[-1]
        if len(parts) > 1 and parts[-2] == "stages" and last.isdigit():
            last = int(last)
        if isinstance(value, dict) and not value:
            node.setdefault(last, {})
        else:
            node[last] = value

    def lists(node):
        if not isinstance(node, dict):
            return node
        out = {}
        for k, v in node.items():
            if k == "stages" and isinstance(v, dict) and all(isinstance(sid, int) for sid in v):
                out[k] = [{"stage_id": sid, **{kk: lists(vv) for kk, vv in v[sid].items() if kk != "stage_id"}}
                          for sid in sorted(v)]
            else:
                out[k] = lists(v)
        return out

    return lists(tree)


def diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """{path: (old value, new value)} for every path whose value differs; MISSING where absent."""
    value = lambda v: v.value if isinstance(v, Leaf) else v
    out = {}
    for path in list(old) + [p for p in new if p not in old]:
        a, b = value(old.get(path, MISSING)), value(new.get(path, MISSING))
        if a is MISSING and b is MISSING:
            continue
        if a != b or type(a) is not type(b):
            out[path] = (a, b)
    return out


def platform_key(path: str) -> str:
    """The resolved key a document path sets: `platforms.rocm.model_runner` -> `model_runner`."""
    parts = path.split(".")
    return ".".join(parts[2:]) if parts[0] == "platforms" and len(parts) > 2 else path


# ---------------------------------------------------------------- the document

class ProfileDoc:
    """One YAML document (a profile, the lanes file), addressed by dotted path."""

    def __init__(self, data: CommentedMap, path: str | os.PathLike | None = None):
        self.data, self.path = data, path

    @classmethod
    def load(cls, path: str | os.PathLike, text: str | None = None) -> "ProfileDoc":
        """Parse, refusing duplicate keys; a file that is not a mapping is an error with its line."""
        try:
            text = Path(path).read_text() if text is None else text
        except FileNotFoundError:
            raise ProfileError("file not found", path=path) from None
        try:
            data = copy.deepcopy(_parse(text))   # callers edit their document
        except DuplicateKeyError as e:
            mark = e.problem_mark or e.context_mark
            raise ProfileError(f"duplicate key: {e.problem}", path=path, line=mark.line + 1 if mark else None) \
                from None
        except MarkedYAMLError as e:
            mark = e.problem_mark or e.context_mark
            problem = " ".join(str(x) for x in (e.context, e.problem) if x)
            raise ProfileError(f"YAML syntax error: {problem}", path=path,
                               line=mark.line + 1 if mark else None) from None
        except YAMLError as e:
            raise ProfileError(f"YAML error: {e}", path=path) from None
        if data is None:
            data = CommentedMap()
        if not isinstance(data, dict):
            raise ProfileError(f"expected a mapping at the top level, got {type(data).__name__}", path=path, line=1)
        return cls(data, path)

    def validate(self, model) -> Any:
        try:
            return model.model_validate(plain(self.data))
        except ValidationError as e:
            key, line, msg = explain_error(e, self.data, model)
            raise ProfileError(msg, path=self.path, key=key, line=line) from None

    def flat(self) -> dict[str, Leaf]:
        try:
            return flatten(self.data)
        except ProfileError as e:
            raise ProfileError(e.message, path=self.path, key=e.key, line=e.line) from None

    def _walk(self, path: str, create: bool = False):
        """(parent node, last key) for a path; creates what is missing when asked."""
        parts = path.split(".")
        node = self.data
        for part in parts[:-1]:
            if isinstance(node, list):   # a stages list: part is a stage_id
                node = self._stage(node, part, create)
            elif part == "stages" and (isinstance(node.get(part), list) or (create and part not in node)):
                if part not in node:
                    node[part] = CommentedSeq()
                node = node[part]
            elif isinstance(node, dict) and isinstance(node.get(part), dict):
                node = node[part]
            elif create and isinstance(node, dict) and part not in node:
                node[part] = CommentedMap()
                node = node[part]
            else:
                return None, None
            if node is None:
                return None, None
        last = parts[-1]
        if isinstance(node, list):
            return None, None
        return node, last

    @staticmethod
    def _stage(stages: list, sid: str, create: bool):
        for item in stages:
            if isinstance(item, dict) and str(item.get("stage_id")) == sid:
                return item
        if not create or not sid.isdigit():
            return None
        item = CommentedMap(stage_id=int(sid))
        stages.append(item)
        return item

    def get(self, path: str, default: Any = MISSING) -> Any:
        leaf = self.flat().get(path)
        return leaf.value if leaf is not None else default

    def line(self, path: str) -> int | None:
        """The line of `path`, or of its deepest part the document has."""
        parts, node, line = path.split("."), self.data, None
        for part in parts:
            if isinstance(node, list):   # a stage by its stage_id, any other list item by its index
                item = self._stage(node, part, False)
                if item is None and part.isdigit() and int(part) < len(node):
                    item = node[int(part)]
                if item is None:
                    break
                node = item
                line = node.lc.line + 1 if isinstance(node, CommentedMap) else line
            elif isinstance(node, dict) and part in node:
                line = key_line(node, part) or line
                node = node[part]
            else:
                break
        return line

    def set(self, path: str, value: Any) -> None:
        parent, last = self._walk(path, create=True)
        if parent is None:
            raise ProfileError(f"cannot set {path}: a part of it is not a mapping", path=self.path, key=path)
        old = parent.get(last)
        if isinstance(old, CommentedSeq) and isinstance(value, list):
            old[:] = value        # keeps the list's flow or block style
        else:
            parent[last] = value

    def delete(self, path: str) -> None:
        parent, last = self._walk(path)
        if parent is not None:
            parent.pop(last, None)

    def dump(self) -> str:
        buf = StringIO()
        _yaml().dump(self.data, buf)
        return buf.getvalue()

    def save(self, path: str | os.PathLike | None = None) -> None:
        Path(path or self.path).write_text(self.dump())
