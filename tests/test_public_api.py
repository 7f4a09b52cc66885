"""The public API of ``biencoder``: each name is its engine home's object, and ``import biencoder`` stays light."""

import importlib
import subprocess
import sys

import pytest

import biencoder

#: every public name and the one module that defines it
HOMES = {
    "run": "biencoder.engine.training.run",
    "Schema": "biencoder.engine.config.schema",
    "read_corpus": "biencoder.engine.data.corpus",
    "read_pairs": "biencoder.engine.data.pair_files",
    "Retriever": "biencoder.engine.inference.retriever",
    "Candidates": "biencoder.engine.inference.retriever",
    "EncodingSettings": "biencoder.engine.inference.retriever",
    "Hit": "biencoder.engine.inference.retriever",
    "run_evaluation": "biencoder.engine.inference.evaluation",
    "load_pair_classifier": "biencoder.engine.inference.export",
    "load_checkpoint": "biencoder.engine.runs.checkpoint",
    "evaluate_tasks": "biencoder.engine.retrieval.official_tasks",
    "BiModel": "biencoder.engine.modeling.model",
    "build_model": "biencoder.engine.modeling.model",
    "BiencoderError": "biencoder.errors",
    "ConfigError": "biencoder.errors",
}


def test_all_lists_the_public_names():
    assert sorted(biencoder.__all__) == sorted(HOMES)
    assert set(biencoder.__all__) <= set(dir(biencoder))


@pytest.mark.parametrize("name", sorted(HOMES))
def test_every_public_name_is_its_engine_homes_object(name):
    home = importlib.import_module(HOMES[name])
    assert getattr(biencoder, name) is getattr(home, name)
    assert getattr(home, name).__module__ == HOMES[name]  # defined there, not re-exported from elsewhere
    namespace = {}
    exec(f"from biencoder import {name}", namespace)
    assert namespace[name] is getattr(home, name)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no_such_name"):
        biencoder.no_such_name  # noqa: B018


def test_no_public_name_is_shadowed_by_a_module_of_the_package():
    """``biencoder.<name>`` is the public object even once every module of the package is imported (a submodule
    named like a public name would take its place)."""
    import pkgutil

    modules = {info.name for info in pkgutil.iter_modules(biencoder.__path__)}
    assert modules & set(biencoder.__all__) == set()


@pytest.mark.parametrize("statement", ["import biencoder", "import biencoder.errors"])
def test_importing_the_package_loads_neither_torch_nor_hydra(statement):
    code = f"import sys\n{statement}\nprint(*sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'hydra')))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == []
