"""Tests of biencoder.bench."""
