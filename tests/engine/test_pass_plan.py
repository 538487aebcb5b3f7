"""Stage 1's codec passes: the cheapest split of the waiting windows, and what goes out when."""
import random

import numpy as np
import pytest

from engine.models.graphs import padded
from engine.profile.resolve import resolve
from engine.profile.schema import Connector
from engine.stage.messages import Frames
from engine.stage1.code2wav import BUCKETS, pass_lengths, stream_windows
from engine.stage1.passes import plan

ROWS = [1, 2, 3, 4, 6, 8]
LENGTHS = [8, 16, 32, 48, 64, 97, 128]


def partitions(items):
    """Every way to split items into unordered groups."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in partitions(rest):
        yield [[first], *part]
        for i in range(len(part)):
            yield [*part[:i], [first, *part[i]], *part[i + 1:]]


def padded_cost(rng):
    """A captured pass's cost: a fixed part and a part a padded row-frame, with noise that keeps it
    growing in both the rows and the length, as measured replays do."""
    fixed, per = rng.uniform(0.2, 3), rng.uniform(0.005, 0.05)
    table = {(r, t): fixed + per * r * t * rng.uniform(1, 1.2) for r in ROWS for t in LENGTHS}
    for r, t in sorted(table):   # growing in each axis
        table[r, t] = max([table[r, t]] + [table[a, b] for a, b in table if a <= r and b <= t])
    return lambda n, longest: table[padded(ROWS, n), padded(LENGTHS, longest)]


@pytest.mark.parametrize("seed", range(40))
def test_no_split_of_the_windows_into_passes_costs_less(seed):
    rng = random.Random(seed)
    lengths = sorted(rng.choice([1, 5, 12, 26, 30, 51, 76, 97, 120]) for _ in range(rng.randint(1, 7)))
    cost = padded_cost(rng)
    max_rows = rng.choice([2, 3, 8])
    groups = plan(lengths, cost, max_rows)
    assert [i for g in groups for i in g] == list(range(len(lengths)))   # each window once, in order
    assert all(0 < len(g) <= max_rows for g in groups)
    total = sum(cost(len(g), lengths[g[-1]]) for g in groups)
    cheapest = min(sum(cost(len(g), max(lengths[i] for i in g)) for g in part)
                   for part in partitions(list(range(len(lengths)))) if all(len(g) <= max_rows for g in part))
    assert total == pytest.approx(cheapest)


def test_a_fixed_part_batches_and_padding_splits():
    lengths = [1, 1, 97, 97]
    assert plan(lengths, lambda n, longest: 300 + n * longest, 32) == [range(0, 4)]
    assert plan(lengths, lambda n, longest: 1 + n * longest, 32) == [range(0, 2), range(2, 4)]
    assert plan([], lambda n, longest: 1.0, 32) == []


def test_groups_are_never_longer_than_max_rows():
    groups = plan([5] * 70, lambda n, longest: 1 + n * longest, 32)
    assert len(groups) == 3 and all(len(g) <= 32 for g in groups)


class Outbox(list):
    put = list.append


def test_a_short_window_goes_out_before_a_long_pass_and_each_requests_chunks_in_order():
    """A shorter final window is decoded in an earlier pass than its request's longer window before
    it, yet goes out after it; another request's first window, arriving last, goes out first."""
    import torch

    from engine.stage1.code2wav import Code2Wav

    out = Outbox()
    worker = Code2Wav(resolve("qwen3_tts", platform="cpu"), out)
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 100, (104, 16))
    calls = []
    for start, end in [(0, 1), (1, 26), (26, 51), (51, 76)]:
        worker.decode([Frames("a", start, codes[start:end], False)])
    worker.decode([Frames("a", 76, codes[76:101], False), Frames("a", 101, codes[101:104], True),
                   Frames("b", 0, codes[:1], False)],
                  after_each=lambda: calls.append(sum(hasattr(m, "index") for m in out)))
    sent = [(m.request_id, m.index) for m in out if hasattr(m, "index")]
    assert sent[-3:] == [("b", 0), ("a", 4), ("a", 5)]
    assert calls == [5, 6, 7]   # after each window, once its chunk is out
    assert worker.passes > 5   # the last call's three windows took more than one pass
    whole = worker.codec(torch.as_tensor(codes)[None])[0].numpy()
    streamed = np.concatenate([m.audio for m in out if getattr(m, "request_id", None) == "a" and hasattr(m, "index")])
    assert np.abs(streamed - whole).max() < 1e-4


@pytest.mark.parametrize("chunking", [{}, {"codec_chunk_frames": 10, "codec_left_context_frames": 30},
                                      {"codec_left_context_frames": 0}, {"initial_codec_chunk_frames": 5}])
def test_every_window_a_stream_makes_before_its_last_runs_unpadded(chunking):
    connector = Connector(**chunking)
    lengths = pass_lengths(connector)
    windows = stream_windows(connector)
    assert windows[-1] == connector.codec_left_context_frames + connector.codec_chunk_frames
    assert set(windows) <= set(lengths)
    assert all(t <= padded(lengths, t) <= max(2 * t, BUCKETS[0]) for t in range(1, lengths[-1] + 1))


def test_a_short_chunk_does_not_multiply_the_captured_passes():
    lengths = pass_lengths(Connector(codec_chunk_frames=1, codec_left_context_frames=72))
    assert len(lengths) <= len(BUCKETS) + 1
    assert 73 in lengths   # the steady window still runs unpadded


def test_the_host_time_passes_take_joins_windows_into_fewer_passes():
    """With captured passes, a pass costs the longer of its replay and the host time a pass has taken (the
    passes are pipelined): once the host time outweighs the replays, windows of two lengths share a pass."""
    from engine.stage1.code2wav import MAX_ROWS, ROWS, Code2Wav

    worker = Code2Wav(resolve("qwen3_tts", platform="cpu"), Outbox())
    worker.pool = object()   # as on CUDA: passes run at the captured shapes, with these replays
    worker.replay_times = {(r, t): 1e-3 * r * t / 97 for r in ROWS for t in worker.lengths}
    windows = [26, 26, 97, 97]
    assert [len(g) for g in plan(windows, worker._pass_cost, MAX_ROWS)] == [2, 2]
    worker.passes, worker.clock.seconds["decode"] = 10, 10 * 5e-3   # 5 ms of host time a pass so far
    assert [len(g) for g in plan(windows, worker._pass_cost, MAX_ROWS)] == [4]
