"""The engine: everything a run computes, free of Hydra (usable from Python with a plain ``DictConfig``).

Imports point down this list (``docs/architecture.md`` says what each module owns; ``tests/test_import_graph.py``
checks that no engine module imports an app, the report or Hydra):

- :mod:`~biencoder.engine.schema`: every config key and its default; :mod:`~biencoder.engine.validation`: the checks;
  :mod:`~biencoder.engine.runtime`: seed, device, precision, determinism, decided once;
- :mod:`~biencoder.engine.layout`, :mod:`~biencoder.engine.corpus`: the ArguAna folders, the tables, deduplication,
  paired splits;
- :mod:`~biencoder.engine.cache`, :mod:`~biencoder.engine.model`, :mod:`~biencoder.engine.loss`: the embedding cache,
  the bi-encoder and its pooled vectors, the losses;
- :mod:`~biencoder.engine.search`, :mod:`~biencoder.engine.negatives`, :mod:`~biencoder.engine.rerank`,
  :mod:`~biencoder.engine.tasks`: nearest neighbours, hard negatives, the one retrieve-then-rerank and its metrics,
  the 8 official tasks;
- :mod:`~biencoder.engine.state`, :mod:`~biencoder.engine.rundir`, :mod:`~biencoder.engine.tracking`,
  :mod:`~biencoder.engine.checkpoint`, :mod:`~biencoder.engine.distributed`: the run folder, loggers, ``best.pt`` and
  ``last.pt``, DDP;
- :mod:`~biencoder.engine.epoch`, :mod:`~biencoder.engine.runner`: one epoch of training, one run end to end
  (:func:`~biencoder.engine.runner.run`);
- :mod:`~biencoder.engine.export`: a run as a sentence-transformers model.
"""
