"""One run end to end: the epoch (mining, batches, the optimisation step: :mod:`~biencoder.engine.training.epoch`; what
a step consumes: :mod:`~biencoder.engine.training.triplets`), contiguous optimiser parameters
(:mod:`~biencoder.engine.training.flat_params`), what a run computes from (its pairs and the encoder's inputs:
:mod:`~biencoder.engine.training.inputs`), what it is scored by (:mod:`~biencoder.engine.training.evaluation`), the
runner that ties data, model, evaluation and the run folder together (:mod:`~biencoder.engine.training.runner`) and the
entry point that validates, holds the folder and records a failure (:func:`~biencoder.engine.training.run.run`).
"""
