"""A trained run put to use: a run folder as a sentence-transformers model plus its pair classifier
(:mod:`~biencoder.engine.inference.export`)."""
