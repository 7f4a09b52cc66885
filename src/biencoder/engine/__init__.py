"""The engine: everything a run computes, free of Hydra (usable from Python with a plain ``DictConfig``).

Sub-packages by concept; imports point down this list (an import-linter contract in ``pyproject.toml``), and
``docs/architecture.md`` says what each module owns:

- :mod:`~biencoder.engine.inference`: a trained run put to use (retrieve, evaluate, export);
- :mod:`~biencoder.engine.training`: one epoch, one run end to end (:func:`~biencoder.engine.training.run.run`);
- :mod:`~biencoder.engine.runs`: the run folder, its records, checkpoints and trackers;
- :mod:`~biencoder.engine.retrieval`: search, hard negatives, retrieve-then-rerank, the 8 official tasks;
- :mod:`~biencoder.engine.modeling` and :mod:`~biencoder.engine.data`: the bi-encoder, its cache and losses; the
  corpus, pair files and paired splits;
- :mod:`~biencoder.engine.machine`: seed, device, precision, determinism, DDP, RNG states;
- :mod:`~biencoder.engine.config` and :mod:`~biencoder.engine.files`: every config key and its checks; files
  written whole and as strict JSON.
"""
