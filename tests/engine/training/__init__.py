"""Tests of biencoder.engine.training."""
