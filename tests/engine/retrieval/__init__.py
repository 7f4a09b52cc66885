"""Tests of biencoder.engine.retrieval."""
