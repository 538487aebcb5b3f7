"""The layout holds: the declared layers, no import circles (imports inside functions count), short
modules and functions, no private names of other projects, and torch only where the models run."""
import ast
import subprocess
import sys
from pathlib import Path

import grimp
import pytest
from importlinter.cli import lint_imports

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted(p for pkg in ("engine", "ci") for p in (ROOT / pkg).rglob("*.py"))


def test_a_cpu_engines_client_never_imports_torch():
    """The stages compute with torch; the process that starts them (a test, a lane's pytest run, the
    server) need not load it, and a suite that starts engines by the hundred would pay for it each time."""
    code = """if True:
        import sys
        import engine.serve.app
        from engine.profile.resolve import resolve
        from engine.request import SpeechRequest
        from engine.runtime.engine import TTSEngine
        with TTSEngine(resolve("qwen3_tts", platform="cpu")) as engine:
            (result,) = engine.generate([SpeechRequest("Hello.", task_type="CustomVoice", voice="ryan")])
        assert result.ok and len(result.audio) > 0, result.error
        print(sorted(m for m in sys.modules if m.split(".")[0] == "torch"))
    """
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == "[]"


def test_import_contracts_hold():
    assert lint_imports(config_filename=str(ROOT / "pyproject.toml")) == 0


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph("engine", "ci", cache_dir=None)


def cycles(graph) -> list[tuple[str, ...]]:
    found = []
    for module in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            back = graph.find_shortest_chain(importer=imported, imported=module)
            if back:
                found.append((module, *back))
    return found


def test_no_import_circles(graph):
    assert cycles(graph) == []


def test_the_circle_check_sees_imports_inside_functions(tmp_path, monkeypatch):
    pkg = tmp_path / "circ"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("import circ.b\n")
    (pkg / "b.py").write_text("def f():\n    from circ import a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert cycles(grimp.build_graph("circ", cache_dir=None))


def _functions(tree):
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_modules_and_functions_are_short(path):
    text = path.read_text()
    assert len(text.splitlines()) <= 300
    long = [(f.name, f.end_lineno - f.lineno + 1) for f in _functions(ast.parse(text))
            if f.end_lineno - f.lineno + 1 > 60]
    assert long == []


def private_imports(tree) -> list[str]:
    """Imports of another project's private names (`_pytest`, `from x import _y`), and modules named
    as strings to be imported, which would hide an import from the layer contracts."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names if any(part.startswith("_") for part in a.name.split("."))]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if any(part.startswith("_") for part in node.module.split(".")) and node.module != "__future__":
                out.append(node.module)
            if node.module.split(".")[0] not in ("engine", "ci"):
                out += [f"{node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                "import_module", "__import__"):
            out.append(ast.unparse(node))
    return out


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_private_names_of_other_projects(path):
    assert private_imports(ast.parse(path.read_text())) == []


def test_the_private_check_catches_what_it_should():
    code = "import _pytest.reports\nfrom pytest_timeout import _get_item_settings\nimport importlib\n" \
           "importlib.import_module('ci.cli')\nfrom engine.x import _ours\n"
    assert len(private_imports(ast.parse(code))) == 3
