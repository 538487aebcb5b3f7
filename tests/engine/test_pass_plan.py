"""Stage 1's pass planner: the cheapest split of the waiting windows into codec passes."""
import itertools
import random

import pytest

from engine.models.graphs import padded
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
