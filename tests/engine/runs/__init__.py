"""Tests of biencoder.engine.runs."""
