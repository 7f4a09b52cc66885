"""A trained run put to use: counters for new arguments (:mod:`~biencoder.engine.inference.retriever`), the 8
official tasks for a checkpoint or an untrained baseline (:mod:`~biencoder.engine.inference.evaluation`), and a run
folder as a sentence-transformers model plus its pair classifier (:mod:`~biencoder.engine.inference.export`)."""
