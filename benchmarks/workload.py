"""What a benchmark level sends and how it is summed up, shared by the offline and online scripts.

A level is steady state: at least 10 x C requests and at least 30 s, whichever is longer, so
ramp-up and drain are a small part of it.  The texts are a committed set averaging about 4 s
of audio a request, from a word to a paragraph; request i takes text i modulo the set.
"""
from __future__ import annotations

import statistics
from pathlib import Path

from results import percentile   # this script's folder is on sys.path when run

TEXTS = [line for line in (Path(__file__).parent / "data" / "texts.txt").read_text().splitlines() if line.strip()]
MIN_SECONDS = 30.0


def min_requests(concurrency: int) -> int:
    return 10 * concurrency


def level_done(issued: int, elapsed: float, concurrency: int) -> bool:
    return issued >= min_requests(concurrency) and elapsed >= MIN_SECONDS


def summarize(done: list[tuple[float, float, float]], wall: float) -> dict:
    """Figures of one level from each request's (time to first audio, latency, audio seconds), all in
    seconds.  mean_in_flight is the requests' summed latency over the wall time (Little's law): a level
    that never reached its concurrency shows it here."""
    ttfp = [1000 * first for first, _, _ in done]
    return {"requests": len(done), "audio_s_per_s": sum(a for _, _, a in done) / wall,
            "ttfp_p50_ms": percentile(ttfp, 0.5), "ttfp_p99_ms": percentile(ttfp, 0.99),
            "rtf_mean": statistics.mean(latency / audio for _, latency, audio in done),
            "mean_in_flight": sum(latency for _, latency, _ in done) / wall, "wall_s": wall}
