"""Errors in a profile (or any YAML document validated against a schema here), said as
`file:line: key: message`, with the key as the document's dotted path."""
from __future__ import annotations

import os
from typing import Any

from pydantic import ValidationError
from ruamel.yaml.comments import CommentedMap, CommentedSeq

from engine.errors import UserError


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


def explain_error(e: ValidationError, data: Any) -> tuple[str, int | None, str]:
    """(key, line, message) for the first error of a validation, in the words of the document."""
    err = e.errors()[0]
    key, line = locate(data, tuple(err["loc"]))
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        msg = "unknown key"
    elif err["type"] != "missing" and "input" in err and not isinstance(err["input"], (dict, list)):
        msg = f"{msg} (got {err['input']!r})"
    return key, line, msg


def format_error(e: ValidationError, data: Any, path: str | os.PathLike) -> str:
    """`file:line: key: message`, the one shape every schema error takes here."""
    key, line, msg = explain_error(e, data)
    return f"{path}{f':{line}' if line else ''}: {key}: {msg}"
