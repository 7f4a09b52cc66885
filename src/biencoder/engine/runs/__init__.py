"""The run folder and what a run leaves in it: its life (create, resume, one writer at a time, clean up only what
this process made: :mod:`~biencoder.engine.runs.folder`), ``metrics.jsonl`` and ``final.json``
(:mod:`~biencoder.engine.runs.records`), ``best.pt`` and ``last.pt`` (:mod:`~biencoder.engine.runs.checkpoint`) and
the experiment trackers a run feeds (:mod:`~biencoder.engine.runs.tracking`)."""
