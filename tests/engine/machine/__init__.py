"""Tests of biencoder.engine.machine."""
