"""Where the profiles come from: the checkout you stand in, else the ones shipped in the package.

A checkout is the nearest directory at or above the working directory that holds `ci/lanes.yaml` and
`profiles/`, or the one `LANEKEEPER_ROOT` names (the CLI's `--root` sets it, so that a lane's pytest
and the servers it starts see the same checkout).  Inside one, its files win over the installed
package's, so that an edit in the checkout is what every command and test acts on.
`LANEKEEPER_PROFILES_DIR` names a profiles directory outright.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from engine.errors import UserError

ROOT_ENV = "LANEKEEPER_ROOT"
PROFILES_ENV = "LANEKEEPER_PROFILES_DIR"
MARKERS = ("ci/lanes.yaml", "profiles")


def is_checkout(path: Path) -> bool:
    return (path / MARKERS[0]).is_file() and (path / MARKERS[1]).is_dir()


def find_checkout(start: Path | None = None) -> Path | None:
    """The checkout `LANEKEEPER_ROOT` names, else the nearest one at or above `start` (the working
    directory), else None."""
    named = os.environ.get(ROOT_ENV)
    if named:
        root = Path(named).resolve()
        if not is_checkout(root):
            raise UserError(f"--root (LANEKEEPER_ROOT) {named}: not a lanekeeper checkout "
                            f"(it needs {' and '.join(MARKERS)})")
        return root
    here = (start or Path.cwd()).resolve()
    return next((p for p in (here, *here.parents) if is_checkout(p)), None)


def require_checkout(command: str) -> Path:
    root = find_checkout()
    if root is None:
        raise UserError(f"{command} needs a lanekeeper checkout: no directory at or above {Path.cwd()} holds "
                        f"{' and '.join(MARKERS)}; run it inside one or pass --root DIR")
    return root


def shipped_profiles() -> Path:
    """The profiles the package carries (`profiles/` copied into the wheel at build time); an editable
    install reads them from the checkout it was installed from."""
    shipped = Path(str(resources.files("engine.profile") / "shipped"))
    return shipped if shipped.is_dir() else Path(__file__).resolve().parents[2] / "profiles"


@dataclass(frozen=True)
class ProfileSource:
    """A profiles directory and why it is the one in use, for the CLI to say."""
    directory: Path
    origin: str    # "checkout", "environment" or "package"

    def describe(self) -> str:
        return f"profiles from {self.directory} ({self.origin})"


def profile_source() -> ProfileSource:
    named = os.environ.get(PROFILES_ENV)
    if named:
        return ProfileSource(Path(named), "environment")
    root = find_checkout()
    if root is not None:
        return ProfileSource(root / "profiles", "checkout")
    return ProfileSource(shipped_profiles(), "package")


def profiles_dir() -> Path:
    return profile_source().directory
