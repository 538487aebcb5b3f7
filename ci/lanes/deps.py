"""The files a lane depends on, computed from the checkout rather than listed by hand.

A lane's tests (its paths), every conftest.py above them and the pytest plugin are where it starts.
From there it depends on every module they import, transitively, as grimp finds the imports
(those inside functions included), on every module the code starts by name in another process
(`python -m X`), on the package `__init__` files on the way, and on the data files that code reads
by a path written in it (`ROOT / "profiles"`, "README.md"): the files of a directory that holds no
Python, a file wherever it is.  pyproject.toml configures every run.  A lane's
`source_file_dependencies` add what none of that reaches.

Each file keeps the chain that brought it in, for `lanekeeper lanes deps LANE` to show.
"""
from __future__ import annotations

import ast
import functools
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ci.lanes.schema import Lane, LaneError

PACKAGES = ("engine", "ci", "tests")
PLUGIN = "ci.pytest_plugin"
ALWAYS = ("pyproject.toml",)


@dataclass(frozen=True)
class Dep:
    path: str                 # relative to the checkout
    chain: tuple[str, ...]    # how the lane reaches it: files, then what the last one does with it


# grimp finds a package through the import system; run where the checkout is first on the path and
# nothing of it is imported yet, so that it reads this checkout's files, not an installed copy's.
_DUMP = """
import json, sys, grimp
g = grimp.build_graph(*sys.argv[1:], cache_dir=None)
print(json.dumps({m: {i: sorted(d["line_number"] for d in g.get_import_details(importer=m, imported=i))
                      for i in g.find_modules_directly_imported_by(m)} for m in g.modules}))
"""


def import_graph(root: Path) -> dict[str, dict[str, list[int]]]:
    packages = [p for p in PACKAGES if (root / p / "__init__.py").is_file()]
    run = subprocess.run([sys.executable, "-c", _DUMP, *packages], cwd=root, capture_output=True, text=True,
                         timeout=120)
    if run.returncode != 0:
        raise LaneError(f"{root}: cannot build the import graph: {(run.stderr.strip().splitlines() or ['?'])[-1]}")
    return json.loads(run.stdout)


class Graph:
    """The checkout's import graph and what each module starts or reads, shared by every lane."""

    def __init__(self, root: Path):
        self.root = root
        self.imports = import_graph(root)          # module -> {module it imports: [line, ...]}
        self.modules = set(self.imports)

    def file(self, module: str) -> str | None:
        base = self.root / module.replace(".", "/")
        for path in (base.with_suffix(".py"), base / "__init__.py"):
            if path.is_file():
                return path.relative_to(self.root).as_posix()
        return None

    def module(self, path: Path) -> str | None:
        rel = path.relative_to(self.root).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        return name if name in self.modules else None

    @functools.cache
    def _scan(self, file: str) -> tuple[list[str], list[str], list[tuple[int, int]]]:
        """One walk of a file: the modules it starts by name, the path texts it writes, its functions' lines."""
        try:
            tree = ast.parse((self.root / file).read_text(), file)
        except (OSError, SyntaxError, ValueError):
            return [], [], []
        started, texts, functions = [], set(), []
        for node in ast.walk(tree):
            if isinstance(node, (ast.List, ast.Tuple)):   # a "-m" followed by a module name: a process started
                items = [e.value if isinstance(e, ast.Constant) else None for e in node.elts]
                names = [name for flag, name in zip(items, items[1:])
                         if flag == "-m" and isinstance(name, str) and name in self.modules]
                started += names + [f"{n}.__main__" for n in names if f"{n}.__main__" in self.modules]
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions.append((node.lineno, node.end_lineno or node.lineno))
            elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):   # ROOT / "a" / "b"
                parts, left = [], node
                while isinstance(left, ast.BinOp) and isinstance(left.op, ast.Div) \
                        and isinstance(left.right, ast.Constant) and isinstance(left.right.value, str):
                    parts.insert(0, left.right.value)
                    left = left.left
                if isinstance(left, ast.Constant) and isinstance(left.value, str):
                    parts.insert(0, left.value)
                texts.add("/".join(parts))
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and 0 < len(node.value) < 200:
                texts.add(node.value)
        texts = [t for t in texts if t and not t.startswith(("/", "-")) and "\n" not in t and ".." not in t]
        return started, sorted(texts), functions

    def started(self, file: str) -> list[str]:
        """Modules the file starts by name in another process (`python -m X`)."""
        return self._scan(file)[0]

    @functools.cache
    def read(self, file: str) -> list[str]:
        """Data files the file names by a path: a string, or the constant parts of `a / "b" / "c"`."""
        return [d for text in self._scan(file)[1] for base in (self.root, (self.root / file).parent)
                for d in self._data(base / text)]

    @functools.cache
    def _data(self, path: Path) -> list[str]:
        try:
            path = path.resolve()
            rel = path.relative_to(self.root)
        except (OSError, ValueError):
            return []
        if not rel.parts or rel.parts[0] == ".git":
            return []
        if path.is_file():
            return [rel.as_posix()]
        if path.is_dir() and not any(path.rglob("*.py")):
            return [p.relative_to(self.root).as_posix() for p in sorted(path.rglob("*")) if p.is_file()]
        return []

    def starts(self, lane: Lane) -> dict[str, str]:
        """The lane's own files (its tests, the conftest.py files above them, the plugin), each with why."""
        out: dict[str, str] = {}
        for entry in lane.paths:
            path = (self.root / entry.split("::")[0])
            files = sorted(path.rglob("*.py")) if path.is_dir() else [path] if path.is_file() else []
            for f in files:
                out.setdefault(f.relative_to(self.root).as_posix(), f"test path {entry}")
            for parent in [path, *path.parents]:
                if parent == self.root.parent:
                    break
                if (parent / "conftest.py").is_file():
                    out.setdefault((parent / "conftest.py").relative_to(self.root).as_posix(), "conftest above it")
        for module in sorted(m for m in self.modules if m == PLUGIN or m.startswith(PLUGIN + ".")):
            out.setdefault(self.file(module), "the pytest plugin")
        for name in ALWAYS:
            if (self.root / name).is_file():
                out.setdefault(name, "configures every pytest run")
        return out

    def deps(self, lane: Lane) -> dict[str, Dep]:
        """Every file the lane depends on, with the chain that reaches it."""
        found = {path: Dep(path, (f"{path} ({why})",)) for path, why in self.starts(lane).items() if path}
        queue = list(found)
        while queue:
            file = queue.pop(0)
            if not file.endswith(".py"):
                continue
            module = self.module(self.root / file)
            nexts = []
            if module:
                nexts += [(m, module) for m in sorted(self.imports[module])]
                parts = module.split(".")
                nexts += [(".".join(parts[:i]), "is in package") for i in range(1, len(parts))]
            nexts += [(m, "starts python -m") for m in self.started(file)]
            targets = [(self.file(m), how) for m, how in nexts] + [(d, "reads") for d in self.read(file)]
            for target, how in targets:
                if target and target not in found:
                    if how == module:   # an import: say whether it is one inside a function
                        how = self._how(module, self.module(self.root / target))
                    found[target] = Dep(target, found[file].chain + (f"{how} {target}",))
                    queue.append(target)
        return found

    def _how(self, importer: str, imported: str) -> str:
        """"imports", or "imports inside a function (line N)" for a lazy import."""
        lines = self.imports.get(importer, {}).get(imported, [])
        functions = self._scan(self.file(importer) or "")[2]
        lazy = [n for n in lines if any(a <= n <= b for a, b in functions)]
        return f"imports inside a function (line {lazy[0]})" if lines and len(lazy) == len(lines) else "imports"

    def check_extras(self, lane: Lane, computed: dict[str, Dep]) -> None:
        """An extra must name something that exists and that the computation does not already cover."""
        for extra in lane.source_file_dependencies:
            path = self.root / extra
            files = [p.relative_to(self.root).as_posix() for p in path.rglob("*") if p.is_file()] \
                if path.is_dir() else [extra] if path.is_file() else None
            if files is None:
                raise LaneError(f"lane {lane.key}: source_file_dependencies names {extra}, which does not exist")
            if all(f in computed for f in files):
                raise LaneError(f"lane {lane.key}: source_file_dependencies names {extra}, which its imports and "
                                "reads already cover; remove it")


def lane_files(lanes: list[Lane], root: Path) -> dict[str, set[str]]:
    """Each lane's computed files plus its extras (directories as prefixes), checked."""
    graph = Graph(root)
    out = {}
    for lane in lanes:
        computed = graph.deps(lane)
        graph.check_extras(lane, computed)
        out[lane.key] = set(computed) | {e.rstrip("/") + "/" if (root / e).is_dir() else e
                                         for e in lane.source_file_dependencies}
    return out
