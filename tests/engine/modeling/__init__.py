"""Tests of biencoder.engine.modeling."""
