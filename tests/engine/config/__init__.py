"""Tests of biencoder.engine.config."""
