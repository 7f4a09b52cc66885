"""What a run is scored by, and what mines its negatives: nearest-neighbour search
(:mod:`~biencoder.engine.retrieval.search`), hard negatives (:mod:`~biencoder.engine.retrieval.negatives`), the one
retrieve-k-then-rerank and its rank metrics (:mod:`~biencoder.engine.retrieval.rerank`), the within-group top-1 of
pair files (:mod:`~biencoder.engine.retrieval.groups`) and the eight official tasks of Wachsmuth et al. (2018) with
the zero-shot and TF-IDF baselines (:mod:`~biencoder.engine.retrieval.official_tasks`)."""
