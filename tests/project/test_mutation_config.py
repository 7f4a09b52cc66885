"""The mutation run's configuration (``[tool.mutmut]`` in pyproject.toml, docs/mutation.md): mutmut runs only the test
files it is given, so a test file that imports a mutated module but is missing from that list makes its mutants look
like survivors (tests/engine/retrieval/test_blocks.py was, after the tests moved into folders)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from conftest import REPO

tomllib = pytest.importorskip("tomllib", reason="Python 3.11 or later reads pyproject.toml")


def mutmut_config() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mutmut"]


def module_name(path: str) -> str:
    """src/biencoder/engine/retrieval/rerank.py -> biencoder.engine.retrieval.rerank"""
    return path.removeprefix("src/").removesuffix(".py").replace("/", ".")


def imported_modules(source: str) -> set[str]:
    """The modules a test file's source imports, ``from a.b import c`` counted as both ``a.b`` and ``a.b.c``."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def files_importing(modules: set[str], tests: Path) -> set[str]:
    return {
        path.relative_to(tests.parent).as_posix()
        for path in tests.rglob("test_*.py")
        if imported_modules(path.read_text()) & modules
    }


def test_imported_modules_reads_both_import_forms():
    source = "import a.b\nfrom c.d import e, f\nfrom . import g\n"
    assert imported_modules(source) == {"a.b", "c.d", "c.d.e", "c.d.f"}


@pytest.mark.slow
def test_every_test_file_of_a_mutated_module_runs_against_its_mutants():
    config = mutmut_config()
    mutated = {module_name(path) for path in config["only_mutate"]}
    assert all((REPO / path).is_file() for path in config["only_mutate"])
    selection = set(config["pytest_add_cli_args_test_selection"])
    assert all((REPO / path).is_file() for path in selection), "a selected test file does not exist"
    assert files_importing(mutated, REPO / "tests") - selection == set()


def test_a_missing_test_file_is_noticed(tmp_path):
    """The check above on a drawn tree: a test file that imports a mutated module by ``from`` is found."""
    (tmp_path / "tests" / "engine").mkdir(parents=True)
    (tmp_path / "tests" / "engine" / "test_x.py").write_text("from biencoder.engine.retrieval import rerank\n")
    (tmp_path / "tests" / "test_y.py").write_text("import numpy\n")
    assert files_importing({"biencoder.engine.retrieval.rerank"}, tmp_path / "tests") == {"tests/engine/test_x.py"}


def test_the_mutation_run_skips_the_whole_runs_only():
    """mutmut deselects exactly the ``whole_run`` tests: each reaches every mutated function, so every surviving
    mutant would pay for them all. ``-m "not slow"`` instead would drop the many unit tests marked slow for the quick
    loop, and a misspelt marker would deselect nothing (``--strict-markers`` only checks decorators)."""
    config = mutmut_config()
    args = config["pytest_add_cli_args"]
    assert args.count("-m") == 1 and args[args.index("-m") + 1] == "not whole_run"
    marked = {
        path.relative_to(REPO).as_posix()
        for path in (REPO / "tests").rglob("test_*.py")
        if re.search(r"^@pytest\.mark\.whole_run$", path.read_text(), re.MULTILINE)
    }
    assert marked and marked <= set(config["pytest_add_cli_args_test_selection"])
