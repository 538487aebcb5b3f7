"""argparse types for the numbers the CLI takes: a bad value is a usage error that says what was expected."""
from __future__ import annotations

import argparse
from pathlib import Path


def whole_number(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value
    return parse


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def port(text: str) -> int:
    value = whole_number(1)(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"port must be 1..65535, got {value}")
    return value


def shard(text: str) -> tuple[int, int]:
    """`K/N`: the K-th of N shards, counted from 1 (as a person says "shard 1 of 2")."""
    k, sep, n = text.partition("/")
    try:
        k, n = int(k), int(n)
    except ValueError:
        k = n = 0
    if not sep or not 1 <= k <= n:
        raise argparse.ArgumentTypeError(f"expected K/N with 1 <= K <= N (shard K of N), got {text!r}")
    return k, n


def output_file(*suffixes: str):
    """A file to write, refused at once (before any work) when its format is not one of `suffixes` or
    it cannot be written where it points."""
    def parse(text: str) -> str:
        path = Path(text)
        if path.suffix.lower() not in suffixes:
            raise argparse.ArgumentTypeError(f"{text}: cannot write {path.suffix or 'a file without an extension'}"
                                             f"; name a {' or '.join(suffixes)} file")
        parent = path.parent
        if path.is_dir():
            raise argparse.ArgumentTypeError(f"{text}: is a directory; name a file in it")
        if not parent.is_dir():
            raise argparse.ArgumentTypeError(f"{text}: directory {parent} does not exist; create it first")
        existed = path.exists()
        try:   # the one true test (permissions, read-only or pseudo file systems, root or not)
            with open(path, "ab"):
                pass
        except OSError as e:
            raise argparse.ArgumentTypeError(f"{text}: cannot be written ({e.strerror})") from None
        if not existed:
            path.unlink()
        return text
    return parse
