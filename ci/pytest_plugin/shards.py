"""What is never split: a matrix cell stays whole on one shard (--shard K/N) and on one pytest-xdist
worker, so its engine or server starts once.  Any other test is a unit of its own."""
from __future__ import annotations

import pytest

from ci.matrix import cell_in


def unit_of(nodeid: str) -> str:
    return cell_in(nodeid) or nodeid


def split(nodeids: list[str], shards: int) -> list[list[str]]:
    """The node ids of each shard.  Units (unit_of) go, largest first (ties by name), to the shard with the
    fewest tests so far: a pure function of the set of ids."""
    units: dict[str, list[str]] = {}
    for nodeid in nodeids:
        units.setdefault(unit_of(nodeid), []).append(nodeid)
    out: list[list[str]] = [[] for _ in range(shards)]
    for _, ids in sorted(units.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        min(out, key=len).extend(ids)   # min() takes the first of equals: the lowest shard
    return out


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    if config.getoption("lk_shard") is None:
        return
    k, n = config.getoption("lk_shard")
    keep = set(split([item.nodeid for item in items], n)[k - 1])
    config.hook.pytest_deselected(items=[item for item in items if item.nodeid not in keep])
    items[:] = [item for item in items if item.nodeid in keep]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Under -n with the default --dist load: a matrix cell is one unit of work, any other test its own.
    xdist's --dist loadgroup would do the grouping too, but it appends "@group" to every node id, and node
    ids are what JUnit, the summary and repro go by."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class CellScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    return CellScheduling(config, log)
