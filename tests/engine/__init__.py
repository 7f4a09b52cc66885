"""Tests of biencoder.engine."""
