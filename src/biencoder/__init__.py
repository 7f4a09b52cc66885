"""biencoder: config-driven ablation runner for bi-encoder counter-argument retrieval.

The names for Python users, each importable from here and from its one home in the engine (``__all__`` lists them)::

    from biencoder import run, Schema               # train one cell: run(cfg, out_dir), cfg shaped as Schema
    from biencoder import read_corpus, read_pairs   # the ArguAna corpus, pair files
    from biencoder import Retriever, Candidates     # counters for new arguments from a trained run
    from biencoder import run_evaluation, evaluate_tasks, load_checkpoint, load_pair_classifier
    from biencoder import BiModel, build_model      # the bi-encoder and its pair classifier
    from biencoder import BiencoderError            # every error a person can fix by changing an input

They are loaded when first used: ``import biencoder`` (like ``import biencoder.errors``) imports neither torch nor
Hydra. The commands are the modules ``biencoder.train``, ``biencoder.evaluate``, ``biencoder.retrieve``, ...
(``python -m biencoder.<module>``); the engine is :mod:`biencoder.engine`.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

#: public name -> the module that defines it
_HOMES = {
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

__all__ = sorted(_HOMES)


def __getattr__(name: str):
    """A public name, imported from its home on first use (a module of the package, e.g. ``biencoder.engine``, is
    found as usual)."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'biencoder' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # found directly from now on
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
