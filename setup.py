"""The wheel carries the shipped profiles as package data (`engine/profile/shipped/`).

They live at the top of the checkout (`profiles/`), where people edit them and where a checkout's
commands read them; the package's copy serves installs used outside a checkout.
"""
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPy(build_py):
    def run(self):
        super().run()
        if self.editable_mode:   # an editable install reads the checkout's profiles/ directly
            return
        dest = Path(self.build_lib, "engine", "profile", "shipped")
        dest.mkdir(parents=True, exist_ok=True)
        for src in sorted(Path(__file__).resolve().parent.joinpath("profiles").glob("*.yaml")):
            shutil.copy2(src, dest / src.name)


setup(cmdclass={"build_py": BuildPy})
