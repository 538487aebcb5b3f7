"""argparse types for the numbers the CLI takes: a bad value is a usage error that says what was expected."""
from __future__ import annotations

import argparse


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
