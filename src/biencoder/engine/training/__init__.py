"""One run end to end: the epoch (mining, batches, the optimisation step: :mod:`~biencoder.engine.training.epoch`),
contiguous optimiser parameters (:mod:`~biencoder.engine.training.flat_params`) and the runner that ties data, model,
evaluation and the run folder together (:mod:`~biencoder.engine.training.runner`, entry point
:func:`~biencoder.engine.training.runner.run`)."""
