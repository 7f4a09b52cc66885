"""Tests of biencoder.engine.data."""
