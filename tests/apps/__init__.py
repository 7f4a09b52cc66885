"""Tests of the command-line apps (biencoder.train, evaluate, retrieve, summary, ...), run as a user runs them."""
