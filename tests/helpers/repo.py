"""git repositories for tests: a copy of this project to commit in, and git run there."""
import shutil
import subprocess
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]
PROFILES_DIR = ROOT / "profiles"   # the checkout's, which every test run from it resolves


def git(repo, *args):
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout.strip()


def copy_project(dest: Path) -> None:
    for rel in git(ROOT, "ls-files", "--cached", "--others", "--exclude-standard").splitlines():
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
