"""Tests of biencoder.engine.inference."""
