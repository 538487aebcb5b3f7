"""The wheel holds what a regular install needs: every package directory of the checkout, the shipped
profiles and the default lanes file."""
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.helpers.repo import copy_project

ROOT = Path(__file__).resolve().parents[2]


def package_dirs() -> set[str]:
    """Every directory under engine/ and ci/ that holds Python code, found by walking the checkout."""
    return {str(p.parent.relative_to(ROOT)) for pkg in ("engine", "ci") for p in (ROOT / pkg).rglob("*.py")
            if "__pycache__" not in p.parts}


def test_the_wheel_holds_every_package_the_profiles_and_the_lanes_file(tmp_path):
    source = tmp_path / "src"   # a clean copy, as CI clones it: no build/ left from an earlier build
    copy_project(source)
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(tmp_path), str(source)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr
    (wheel,) = tmp_path.glob("lanekeeper-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {str(Path(n).parent) for n in names if n.endswith(".py")} == package_dirs()
    assert all(f"{d}/__init__.py" in names for d in package_dirs())
    profiles = {p.name for p in (ROOT / "profiles").glob("*.yaml")}
    assert {Path(n).name for n in names if n.startswith("engine/profile/shipped/")} == profiles
    assert "ci/lanes.yaml" in names
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "[pytest11]" in text and "ci.pytest_plugin" in text
