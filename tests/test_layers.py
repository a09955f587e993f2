"""The architecture's layering (docs/development.md): every import points down the layers.

:func:`import_edges` reads every import of a source tree: at the top of a file, inside
functions, relative ones, and module paths named in strings (``importlib.import_module``,
lazy maps). :func:`violations` names each import that runs up a layer, and :func:`cycles`
each import cycle among files or among packages. The tests apply them to ``src/cogcal``
and, to show that they can fail, to small trees that break each rule.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

#: Layers, lowest first. A module belongs to the longest prefix listed; it may import its
#: own layer and those below. ``cogcal`` itself (the package's ``__init__``) is the public
#: facade: its eager imports are the core (checked below), its lazy names may reach any layer.
LAYERS: tuple[tuple[str, ...], ...] = (
    (
        "cogcal._version",
        "cogcal._errors",
        "cogcal._checks",
        "cogcal._constraints",
        "cogcal._io",
        "cogcal._registry",
        "cogcal.calibrators",
        "cogcal.metrics",
        "cogcal.losses",
        "cogcal.cog",
        "cogcal.posthoc",
        "cogcal.conformal",
        "cogcal.health",
        "cogcal.models",
    ),
    ("cogcal.data",),
    ("cogcal.runs",),
    ("cogcal.train",),
    ("cogcal.bench", "cogcal.report"),
    ("cogcal.commands",),
    ("cogcal.cli", "cogcal.__main__"),
)
LAYER_NAMES = ("core", "data", "runs", "train", "bench/report", "commands", "cli")
#: Packages of one layer that stay independent: the bench returns data, the report reads
#: folders; the `bench` command runs the one, then renders the other.
INDEPENDENT = ("cogcal.bench", "cogcal.report")
FACADE = "cogcal"

HEAVY = ("lightning", "pandas", "matplotlib", "sklearn", "scipy", "torchvision", "yaml")


def module_names(src: Path, package: str = "cogcal") -> dict[str, Path]:
    """Every module of ``package`` under ``src``, by dotted name."""
    names = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def _docstring_nodes(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def import_edges(src: Path, package: str = "cogcal") -> list[tuple[str, str, int, str]]:
    """``(module, imported module, line, how)`` for every import of ``package`` by itself.

    ``how`` is ``"top"``, ``"function"`` or ``"string"``. ``from A import b`` counts as an
    import of ``A.b`` when that is a module, else of ``A``.
    """
    modules = module_names(src, package)
    edges = []
    for mod, path in modules.items():
        is_pkg = path.name == "__init__.py"
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        docstrings = _docstring_nodes(tree)
        inner = {
            id(n)
            for f in ast.walk(tree)
            if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
            for n in ast.walk(f)
        }
        for node in ast.walk(tree):
            how = "function" if id(node) in inner else "top"
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    where = ".".join(base + ([node.module] if node.module else []))
                else:
                    where = node.module or ""
                for alias in node.names:
                    sub = f"{where}.{alias.name}"
                    targets.append(sub if sub in modules else where)
            elif (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and node.value in modules
                and node.value != package
                and id(node) not in docstrings
            ):
                targets, how = [node.value], "string"
            for target in targets:
                if target == package or target.startswith(package + "."):
                    edges.append((mod, target, node.lineno, how))
    return edges


def layer_of(module: str) -> int | None:
    """The layer index of ``module`` (longest listed prefix), ``None`` if unlisted."""
    best, level = -1, None
    for i, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, level = len(prefix), i
    return level


def violations(edges: list[tuple[str, str, int, str]], modules: dict[str, Path]) -> list[str]:
    """One line per import that runs up a layer, or per module in no layer."""
    found = []
    for mod in modules:
        if mod != FACADE and layer_of(mod) is None:
            found.append(f"{modules[mod]}: module {mod} is in no layer (add it to LAYERS)")
    for mod, target, line, how in edges:
        if mod == FACADE or target == FACADE:
            continue
        src_level, dst_level = layer_of(mod), layer_of(target)
        if src_level is None or dst_level is None:
            continue
        pair = {_package(mod), _package(target)}
        if len(pair) == 2 and pair <= set(INDEPENDENT):
            found.append(
                f"{modules[mod]}:{line}: {mod} imports {target}: {' and '.join(INDEPENDENT)} "
                f"are independent [{how}]"
            )
            continue
        if dst_level <= src_level:
            continue
        found.append(
            f"{modules[mod]}:{line}: {mod} ({LAYER_NAMES[src_level]}) imports {target} "
            f"({LAYER_NAMES[dst_level]}, a layer above) [{how}]"
        )
    return found


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one node."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _package(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2])


def cycles(edges: list[tuple[str, str, int, str]]) -> list[str]:
    """One line per import cycle among files, and among the packages under ``cogcal``.

    The facade (``cogcal`` itself) and a package's own ``__init__`` importing its modules
    are not cycles of design (an ``__init__`` re-exports what its modules define)."""
    files: dict[str, set[str]] = defaultdict(set)
    packages: dict[str, set[str]] = defaultdict(set)
    for mod, target, _line, _how in edges:
        if FACADE in (mod, target) or mod == target:
            continue
        if not target.startswith(mod + "."):  # a package __init__ importing its own module
            files[mod].add(target)
        if _package(mod) != _package(target):
            packages[_package(mod)].add(_package(target))
    found = [f"import cycle among files: {' -> '.join(c)}" for c in _strongly_connected(files)]
    found += [
        f"import cycle among packages: {' -> '.join(c)}" for c in _strongly_connected(packages)
    ]
    return found


def test_every_import_points_down_the_layers():
    modules = module_names(SRC)
    bad = violations(import_edges(SRC), modules)
    assert not bad, "imports that run up a layer:\n" + "\n".join(bad)


def test_no_import_cycle_among_files_or_packages():
    bad = cycles(import_edges(SRC))
    assert not bad, "\n".join(bad)


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / "cogcal" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


@pytest.mark.parametrize(
    "source",
    [
        "from cogcal.train.fit import fit\n",  # at the top of the file
        "def f():\n    from ..train import fit\n",  # inside a function, relative
        "import importlib\nM = importlib.import_module('cogcal.train.fit')\n",  # a string
        "import cogcal.train.fit as fit\n",
    ],
)
def test_an_import_up_a_layer_fails_naming_the_file_and_the_import(tmp_path, source):
    src = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "metrics/__init__.py": "",
            "metrics/evaluate.py": source,
            "train/__init__.py": "",
            "train/fit.py": "fit = None\n",
        },
    )
    bad = violations(import_edges(src), module_names(src))
    assert len(bad) == 1, bad
    assert "metrics/evaluate.py:" in bad[0]
    assert "cogcal.metrics.evaluate (core) imports cogcal.train" in bad[0]


def test_a_docstring_naming_a_module_is_not_an_import(tmp_path):
    src = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "metrics.py": '"""See cogcal.train."""\n',
            "train/__init__.py": "",
        },
    )
    assert violations(import_edges(src), module_names(src)) == []


def test_bench_and_report_stay_independent(tmp_path):
    src = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "bench/__init__.py": "",
            "bench/session.py": "from cogcal.report.build import build_report\n",
            "report/__init__.py": "",
            "report/build.py": "build_report = None\n",
        },
    )
    bad = violations(import_edges(src), module_names(src))
    assert len(bad) == 1 and "cogcal.bench.session imports cogcal.report.build" in bad[0]


def test_a_module_in_no_layer_fails(tmp_path):
    src = _tree(tmp_path, {"__init__.py": "", "gadgets.py": ""})
    bad = violations(import_edges(src), module_names(src))
    assert len(bad) == 1 and "cogcal.gadgets is in no layer" in bad[0]


def test_cycles_are_found_among_files_and_packages(tmp_path):
    src = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "bench/__init__.py": "",
            "bench/a.py": "from cogcal.report import b\n",
            "report/__init__.py": "",
            "report/b.py": "def f():\n    from cogcal.bench import a\n",
        },
    )
    found = cycles(import_edges(src))
    assert "import cycle among files: cogcal.bench.a -> cogcal.report.b" in found
    assert "import cycle among packages: cogcal.bench -> cogcal.report" in found


def test_core_imports_only_torch_and_numpy():
    code = (
        "import sys, cogcal, cogcal.calibrators, cogcal.cog, cogcal.losses, cogcal.metrics, cogcal.posthoc\n"
        f"print([m for m in {HEAVY!r} if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_train_command_imports_no_heavy_dependency_nor_pillow():
    """The modules a `cogcal train` on arrays (mnist1d, a table) loads import none of the
    heavy dependencies nor Pillow (start-up time: docs/performance.md, "Start-up")."""
    code = (
        "import sys, cogcal.cli, cogcal.commands.train, cogcal.train.runner, cogcal.data\n"
        "cogcal.cli.build_parser()\n"
        f"print([m for m in {(*HEAVY, 'PIL')!r} if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


@pytest.mark.slow
def test_cli_help_list_and_report_never_import_lightning(tmp_path):
    """`cogcal --help`, `cogcal bench --list` and `cogcal report` (a bench folder and a run
    folder) run without importing Lightning, as does a single-process CPU `cogcal train`."""
    (tmp_path / "bench").mkdir()
    code = f"""
import contextlib, io, sys
import cogcal.cli
out = io.StringIO()
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
    with contextlib.suppress(SystemExit):
        cogcal.cli.main(["--help"])
    assert cogcal.cli.main(["bench", "--list"]) == 0
    assert cogcal.cli.main(["report", {str(tmp_path / "bench")!r}]) == 2  # no results.csv
    assert cogcal.cli.main(["train", "--preset", "paper", "--epochs", "1", "--no-progress",
                            "--data-root", {str(tmp_path / "data")!r},
                            "--out", {str(tmp_path / "run")!r}]) == 0
    assert cogcal.cli.main(["report", {str(tmp_path / "run")!r}]) == 0
print([m for m in sys.modules if m == "lightning" or m.startswith(("lightning.", "lightning_fabric"))])
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1] == "[]", res.stdout
