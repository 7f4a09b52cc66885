"""Tests of biencoder.report: the tables, statistics and figures of a comparison."""
