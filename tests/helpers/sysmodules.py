"""A pytest plugin (`-p tests.helpers.sysmodules`) that writes, once collection is done, every file of the
checkout that the run has imported, to the JSON file LANEKEEPER_SYSMODULES_OUT names: what a lane's
tests really import, to hold the computed lane dependencies against."""
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def imported_files() -> list[str]:
    out = set()
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if path and Path(path).resolve().is_relative_to(ROOT):
            out.add(Path(path).resolve().relative_to(ROOT).as_posix())
    return sorted(out)


def pytest_collection_finish(session):
    with open(os.environ["LANEKEEPER_SYSMODULES_OUT"], "w") as f:
        json.dump(imported_files(), f)


if __name__ == "__main__":   # what an engine's processes import: the stages' and the server's entry points
    import engine.serve.__main__  # noqa: F401
    import engine.stage0.process  # noqa: F401
    import engine.stage1.process  # noqa: F401

    print(json.dumps(imported_files()))
