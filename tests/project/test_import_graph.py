"""The import rules: import-linter's contracts (``[tool.importlinter]`` in pyproject.toml) on biencoder and on copies
of it with one bad import each; what they cannot say (function-local imports, what a fresh Python loads) through the
import graph of :mod:`biencoder.bench.import_graph`, checked itself on a package drawn by hand."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from biencoder.bench import import_graph as graph_tool
from conftest import REPO

SRC = REPO / "src"
#: the contracts by their names in pyproject.toml
LAYERS = "Imports point down: bench -> apps -> report -> engine -> errors"
ACYCLIC = "No circle between the modules of a package, function-local imports included"
ENGINE_HYDRA = "The engine is Hydra-free"
ENGINE_LAYERS = "The engine's packages import down their chain"
SCHEMA = "The schema needs neither torch nor Hydra (the plot imports it)"


def lint_imports(src: Path) -> tuple[int, dict[str, str], str]:
    """Runs lint-imports with this checkout's contracts on the ``biencoder`` package under ``src`` (no cache written);
    its exit code, ``{contract name: "KEPT" | "BROKEN"}`` and its report (which import broke which contract)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")])}
    code = "from importlinter.cli import lint_imports_command; lint_imports_command()"
    done = subprocess.run(
        [sys.executable, "-c", code, str(REPO / "pyproject.toml"), "--no-cache", "--no-logo"],
        cwd=src,
        env=env,
        capture_output=True,
        text=True,
    )
    verdicts = dict(re.findall(r"^(.+?) ?(KEPT|BROKEN)$", done.stdout, flags=re.M))
    assert verdicts, done.stdout + done.stderr
    return done.returncode, verdicts, done.stdout


def test_the_import_contracts_hold():
    code, verdicts, report = lint_imports(SRC)
    assert {LAYERS, ENGINE_LAYERS, ACYCLIC, ENGINE_HYDRA, SCHEMA} <= set(verdicts)
    assert code == 0 and set(verdicts.values()) == {"KEPT"}, report


@pytest.mark.slow
@pytest.mark.parametrize(
    "module, line, broken",
    [
        ("engine/retrieval/search.py", "import hydra", ENGINE_HYDRA),
        ("engine/retrieval/search.py", "from biencoder.report import runs", LAYERS),
        ("report/statistics.py", "def plot():\n    from biencoder import summary", LAYERS),  # a function-local one too
        ("summary.py", "from biencoder.bench import common", LAYERS),  # nothing of the product imports the bench
        (
            "engine/retrieval/search.py",
            "def later():\n    from biencoder.engine.retrieval import rerank",
            ACYCLIC,
        ),  # rerank imports search
        ("engine/config/schema.py", "import torch", SCHEMA),
        ("engine/data/paired.py", "from biencoder.engine.modeling import model", ENGINE_LAYERS),  # independent
        ("engine/runs/records.py", "from biencoder.engine.training import epoch", ENGINE_LAYERS),  # points up
    ],
)
def test_a_bad_import_breaks_its_contract(tmp_path, module, line, broken):
    """On a copy of the package with ``line`` appended to ``module``, lint-imports fails and names the contract."""
    shutil.copytree(SRC / "biencoder", tmp_path / "biencoder", ignore=shutil.ignore_patterns("__pycache__"))
    with open(tmp_path / "biencoder" / module, "a", encoding="utf-8") as f:
        f.write(f"\n{line}\n")
    code, verdicts, report = lint_imports(tmp_path)
    assert code == 1 and verdicts[broken] == "BROKEN", report


def test_a_package_drawn_by_hand(tmp_path):
    """a ↔ b at import time; a → c and c → a only inside functions (a hidden circle); sub.d imports Hydra, e imports
    sub.d at the top (so Hydra too), a imports sub.d only in a function (so not)."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "",
        "sub/__init__.py": "",
        "a.py": "from . import b\n\ndef f():\n    from .c import x\n    from .sub import d\n",
        "b.py": "import pkg.a\nimport numpy\n",
        "c.py": "x = 1\n\ndef g():\n    from . import a\n",
        "sub/d.py": "from ..a import f\ntry:\n    import hydra\nexcept ImportError:\n    pass\n",
        "e.py": "class E:\n    from .sub.d import f\n",
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    graph = graph_tool.import_graph(pkg)
    got = {name: (m.top, m.local, m.lines) for name, m in graph.items()}
    assert got == {
        "pkg": ([], [], 0),
        "pkg.sub": ([], [], 0),
        "pkg.a": (["pkg.b"], ["pkg.c", "pkg.sub.d"], 5),
        "pkg.b": (["pkg.a"], [], 2),
        "pkg.c": ([], ["pkg.a"], 4),
        "pkg.sub.d": (["pkg.a"], [], 5),
        "pkg.e": (["pkg.sub.d"], [], 2),
    }
    assert graph_tool.circles(graph) == [["pkg.a", "pkg.b"]]
    assert graph_tool.circles(graph, local=True) == [["pkg.a", "pkg.b", "pkg.c", "pkg.sub.d"]]
    hydra = graph_tool.imports_hydra(graph)
    assert {n for n, h in hydra.items() if h} == {"pkg.sub.d", "pkg.e"}


@pytest.fixture(scope="module")
def graph():
    return graph_tool.import_graph()


@pytest.mark.slow
def test_reporting_imports_the_encoder_only_when_asked(graph):
    """The only function-local import of the report package and its app is the one that keeps the encoder
    (transformers) out of a plain plot."""
    ours = {n: m for n, m in graph.items() if n.startswith("biencoder.report") or n == "biencoder.summary"}
    assert len(ours) >= 8
    assert {n: m.local for n, m in ours.items() if m.local} == {"biencoder.summary": ["biencoder.report.baselines"]}


def loaded(modules: list[str], watched: tuple[str, ...]) -> list[str]:
    """Which of ``watched`` a fresh Python has in ``sys.modules`` after importing ``modules``."""
    code = f"import sys, {', '.join(modules)}; print(*sorted(m for m in {watched!r} if m in sys.modules))"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()


@pytest.mark.slow
def test_reporting_does_not_import_hydra_or_draw_unasked():
    """Importing the plot app and every report module loads neither Hydra nor Matplotlib (figures import it when
    they draw); the statistics need numpy only."""
    apps = ["biencoder.summary", "biencoder.report.baselines", "biencoder.errors"]
    assert loaded(apps, ("hydra", "matplotlib")) == []
    assert loaded(["biencoder.report.statistics"], ("pandas", "torch")) == []


def test_the_architecture_map_names_every_module(graph):
    """Every module of today is named in the map (`report.runs`, or `cache.py` in its now-vs-target table)."""
    text = (REPO / "docs" / "architecture.md").read_text()
    short = [n[len("biencoder.") :] for n in graph if n != "biencoder"]
    missing = [n for n in short if f"`{n}`" not in text and f"`{n.replace('.', '/')}.py`" not in text]
    assert missing == []


def test_the_schema_and_validation_import_what_the_map_says(graph):
    """The schema imports nothing of biencoder but the packaged paths (which import errors only), and, by contract,
    neither Hydra nor torch (a fresh Python that imports it has neither); no engine module imports another inside a
    function (validation reads each loss's keys from the schema, not from the loss module)."""
    assert graph["biencoder.engine.config.schema"].top == ["biencoder.engine.config.packaged"]
    assert graph["biencoder.engine.config.packaged"].top == ["biencoder.errors"]
    assert {n: m.local for n, m in graph.items() if n.startswith("biencoder.engine") and m.local} == {}
    assert "biencoder.engine.modeling.loss" not in graph["biencoder.engine.config.validation"].top
    assert loaded(["biencoder.engine.config.schema"], ("hydra", "torch")) == []


def test_the_engine_reads_no_node_of_hydras():
    """The resolvers that read Hydra's own nodes (``hydra.sweep.dir``, ``hydra.runtime.output_dir``, the ``.hydra``
    folder) live in hydra_glue: no string in the engine's code names one."""
    import ast

    named = sorted(
        f"{path.name}: {node.value}"
        for path in (SRC / "biencoder" / "engine").rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and str(node.value).startswith(("hydra.", ".hydra"))
    )
    assert named == []


@pytest.mark.slow
def test_importing_the_engine_loads_no_hydra(graph):
    """A fresh Python that imports every module of biencoder.engine has no Hydra module in sys.modules: the engine
    runs from Python with a plain config object (the contract says no engine module imports Hydra; this says that
    nothing it imports does either)."""
    engine = sorted(n for n in graph if n.startswith("biencoder.engine."))
    assert len(engine) >= 18
    code = f"import sys, {', '.join(engine)}; print(*sorted(m for m in sys.modules if m.startswith('hydra')))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == []


@pytest.mark.slow
def test_the_house_limits_hold(graph):
    """docs/architecture.md, "Now, measured": no module over 350 lines, no function over 50, none with more than 6
    parameters (an object is missing), no line over 119 characters in src/, tests/ or scripts/."""
    assert {n: m.lines for n, m in graph.items() if m.lines > graph_tool.MODULE_LINES} == {}
    assert graph_tool.long_functions() == []
    assert graph_tool.wide_functions() == []
    assert set(graph_tool.long_lines().values()) == {0}


def test_long_lines_are_counted_per_tree(tmp_path):
    """120 characters count, 119 do not; a checkout's tests/ and scripts/ are counted beside the package."""
    package = tmp_path / "src" / "pkg"
    package.mkdir(parents=True)
    (package / "m.py").write_text("x = 1  # " + "a" * 110 + "\n" + "y = 2  # " + "b" * 111 + "\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "t.py").write_text("z = 3\n")
    assert [len(line) for line in (package / "m.py").read_text().splitlines()] == [119, 120]
    assert graph_tool.long_lines(package) == {"src": 1, "tests": 0}


def test_long_and_wide_functions_are_found(tmp_path):
    """51 lines are reported (a function and a method), 50 are not; 7 parameters are, 6 are not (nor a method's
    self, nor ``*args``/``**kwargs``)."""
    (tmp_path / "pkg").mkdir()
    body = "".join(f"    x{i} = {i}\n" for i in range(49))
    method = body.replace("    x", "        x")
    (tmp_path / "pkg" / "m.py").write_text(
        f"def short():\n{body}\n\ndef long():\n{body}    y = 1\n\n\n"
        f"class C:\n    def method(self):\n{method}        return 1\n\n"
        "    def six(self, a, b, c, /, d, *args, e, f, **kwargs):\n        pass\n\n"
        "def seven(a, b, c, d, e, f, *, g=1):\n    pass\n"
    )
    assert sorted(graph_tool.long_functions(tmp_path / "pkg")) == [("pkg.m", "C.method", 51), ("pkg.m", "long", 51)]
    assert graph_tool.wide_functions(tmp_path / "pkg") == [("pkg.m", "seven", 7)]


def test_no_test_file_imports_another():
    """Helpers that several test files use live in tests/helpers.py or conftest.py: a test file importing another
    hides where a helper is defined and ties the two files' changes together (issue 52 counted 11 such imports)."""
    imports = re.compile(r"\s*(from|import) ([\w.]+\.)?test_\w+")
    found = [
        f"{path.relative_to(REPO)}: {line.strip()}"
        for path in sorted((REPO / "tests").rglob("*.py"))
        for line in path.read_text().splitlines()
        if imports.match(line)
    ]
    assert found == []
