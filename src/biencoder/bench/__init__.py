"""Measurements of biencoder itself: the benchmarks of its hot paths and the import graph of its source.

``python scripts/bench.py`` (or ``python -m biencoder.bench``) runs the benchmark items and prints one table; each
item is one module: evaluation of a split against the seed scripts' evaluator (:mod:`.eval_speed`), training
throughput with an MFU estimate (:mod:`.train_throughput`), the cost of mining (:mod:`.mining_cost`), one frozen
real-corpus epoch by phase (:mod:`.frozen_epoch`), operator calls and host syncs per training step
(:mod:`.step_counts`), one fine-tuning epoch by phase (:mod:`.finetune_epoch`) and the 20-run ablation's wall clock
(:mod:`.ablation_sweep`). What they share is in :mod:`.common` (timer, op counter, MFU estimator, the seed-style
evaluator, the corpus check) and :mod:`.epoch_phases` (an epoch timed through the runner's own phase hook); the
command line is :mod:`.cli`. :mod:`.import_graph` measures the source (``python scripts/import_graph.py``), for
``docs/architecture.md`` and the tests.

Nothing here is imported by the product: the import contracts in ``pyproject.toml`` put this package above the apps.
Importing any module of it imports neither Hydra nor the packaged MiniLM (the items that need them import them when
they run), so the first items run on a bare GPU image.
"""
