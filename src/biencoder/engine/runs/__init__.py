"""The run folder and what a run leaves in it: its life (create, resume, clean up only what this process made:
:mod:`~biencoder.engine.runs.folder`), one writer at a time (:mod:`~biencoder.engine.runs.lock`), ``metrics.jsonl``
and ``final.json`` (:mod:`~biencoder.engine.runs.records`), ``best.pt`` and ``last.pt``
(:mod:`~biencoder.engine.runs.checkpoint`) and the experiment trackers a run feeds
(:mod:`~biencoder.engine.runs.tracking`)."""
