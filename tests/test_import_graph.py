"""The import graph (biencoder.bench.import_graph), on a package drawn by hand and on biencoder itself."""

import subprocess
import sys

import pytest

from biencoder.bench import import_graph as graph_tool
from conftest import REPO

#: circles allowed to remain (docs/architecture.md, "Left"): none since config.py was split
KNOWN_CIRCLES: list[list[str]] = []


def test_a_package_drawn_by_hand(tmp_path):
    """a ↔ b at import time; a → c and c → a only inside functions (a hidden circle); sub.d imports Hydra, e imports
    sub.d at the top (so Hydra too), a imports sub.d only in a function (so not)."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    files = {"__init__.py": "", "sub/__init__.py": "",
             "a.py": "from . import b\n\ndef f():\n    from .c import x\n    from .sub import d\n",
             "b.py": "import pkg.a\nimport numpy\n",
             "c.py": "x = 1\n\ndef g():\n    from . import a\n",
             "sub/d.py": "from ..a import f\ntry:\n    import hydra\nexcept ImportError:\n    pass\n",
             "e.py": "class E:\n    from .sub.d import f\n"}
    for name, text in files.items():
        (pkg / name).write_text(text)
    graph = graph_tool.import_graph(pkg)
    got = {name: (m.top, m.local, m.lines) for name, m in graph.items()}
    assert got == {"pkg": ([], [], 0), "pkg.sub": ([], [], 0),
                   "pkg.a": (["pkg.b"], ["pkg.c", "pkg.sub.d"], 5), "pkg.b": (["pkg.a"], [], 2),
                   "pkg.c": ([], ["pkg.a"], 4), "pkg.sub.d": (["pkg.a"], [], 5), "pkg.e": (["pkg.sub.d"], [], 2)}
    assert graph_tool.circles(graph) == [["pkg.a", "pkg.b"]]
    assert graph_tool.circles(graph, local=True) == [["pkg.a", "pkg.b", "pkg.c", "pkg.sub.d"]]
    hydra = graph_tool.imports_hydra(graph)
    assert {n for n, h in hydra.items() if h} == {"pkg.sub.d", "pkg.e"}


@pytest.fixture(scope="module")
def graph():
    return graph_tool.import_graph()


def test_no_circle_at_import_time_and_no_new_hidden_one(graph):
    assert graph_tool.circles(graph) == []
    assert all(c in KNOWN_CIRCLES for c in graph_tool.circles(graph, local=True))


def test_reporting_imports_point_down(graph):
    """The report package and its app: no circle, and the only function-local import is the one that keeps the
    encoder (transformers) out of a plain plot."""
    ours = {n: m for n, m in graph.items() if n.startswith("biencoder.report") or n == "biencoder.summary"}
    assert len(ours) >= 8
    assert {n: m.local for n, m in ours.items() if m.local} == {"biencoder.summary": ["biencoder.report.baselines"]}
    assert not any(n in c for c in graph_tool.circles(graph, local=True) for n in ours)
    assert all("biencoder.summary" not in m.top + m.local for n, m in graph.items() if n.startswith("biencoder.report"))


def loaded(modules: list[str], watched: tuple[str, ...]) -> list[str]:
    """Which of ``watched`` a fresh Python has in ``sys.modules`` after importing ``modules``."""
    code = f"import sys, {', '.join(modules)}; print(*sorted(m for m in {watched!r} if m in sys.modules))"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()


def test_reporting_does_not_import_hydra_or_draw_unasked():
    """Importing the plot app and every report module loads neither Hydra nor Matplotlib (figures import it when
    they draw); the statistics need numpy only."""
    assert loaded(["biencoder.summary", "biencoder.report.baselines", "biencoder.errors"], ("hydra", "matplotlib")) == []
    assert loaded(["biencoder.report.statistics"], ("pandas", "torch")) == []


def test_the_architecture_map_names_every_module(graph):
    """Every module of today is named in the map (`report.runs`, or `cache.py` in its now-vs-target table)."""
    text = (REPO / "docs" / "architecture.md").read_text()
    short = [n[len("biencoder."):] for n in graph if n != "biencoder"]
    missing = [n for n in short if f"`{n}`" not in text and f"`{n.replace('.', '/')}.py`" not in text]
    assert missing == []


def test_hydra_stays_in_the_apps_and_hydra_glue(graph):
    """Only the Hydra apps, hydra_glue and the compatibility module config (which re-exports hydra_glue) import
    Hydra; the schema imports nothing of biencoder but errors, and neither Hydra nor torch (validation imports loss,
    for the loss keys, only when validate runs: it imports torch)."""
    hydra = {n for n, h in graph_tool.imports_hydra(graph).items() if h}
    assert hydra == {"biencoder.train", "biencoder.evaluate", "biencoder.callbacks", "biencoder.hydra_glue",
                     "biencoder.config"}
    assert graph["biencoder.engine.schema"].top == ["biencoder.errors"]
    assert graph["biencoder.engine.schema"].local == []
    assert graph["biencoder.engine.validation"].local == ["biencoder.engine.loss"]
    assert loaded(["biencoder.engine.schema"], ("hydra", "torch")) == []


def test_the_engine_is_hydra_free_and_imports_point_down(graph):
    """Every module of biencoder.engine imports only the engine and errors (never an app, the report or Hydra), and a
    fresh Python that imports all of them has no Hydra in sys.modules: the engine runs from Python with a plain
    config object."""
    engine = sorted(n for n in graph if n.startswith("biencoder.engine."))
    assert len(engine) >= 18
    for name in engine:
        m = graph[name]
        assert all(t.startswith("biencoder.engine") or t == "biencoder.errors" for t in m.top + m.local), (name, m)
    assert loaded(engine, ("hydra",)) == []


def test_no_function_over_50_lines():
    """The house limit (docs/architecture.md, "Now, measured"): a longer function is split, as run_evaluation was."""
    assert graph_tool.long_functions() == []


def test_long_functions_finds_a_long_function_and_method(tmp_path):
    """51 lines are reported (a function and a method), 50 are not."""
    (tmp_path / "pkg").mkdir()
    body = "".join(f"    x{i} = {i}\n" for i in range(49))
    method = body.replace("    x", "        x")
    (tmp_path / "pkg" / "m.py").write_text(f"def short():\n{body}\n\ndef long():\n{body}    y = 1\n\n\n"
                                           f"class C:\n    def method(self):\n{method}        return 1\n")
    assert sorted(graph_tool.long_functions(tmp_path / "pkg")) == [("pkg.m", "C.method", 51), ("pkg.m", "long", 51)]
