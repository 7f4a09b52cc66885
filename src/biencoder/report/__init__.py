"""Reporting: compare finished runs (``biencoder-plot``, ``scripts/plot_top1.py``; the app is
:mod:`biencoder.summary`).

One concept per module, imports pointing down this list:

- :mod:`~biencoder.report.statistics`: bootstrap, Holm, Wilson (numpy only);
- :mod:`~biencoder.report.runs`: find run folders, read them, group them into cells;
- :mod:`~biencoder.report.tables`: per-cell table, paired comparisons, Markdown;
- :mod:`~biencoder.report.figures`: the Matplotlib figures;
- :mod:`~biencoder.report.stability`: results against a swept key (``--x``);
- :mod:`~biencoder.report.baselines`: cells against zero-shot and TF-IDF on the same queries (``--baselines``);
- :mod:`~biencoder.report.trackers`: the figure and tables attached to the runs' MLflow experiments.
"""

from ..errors import BiencoderError


class SummaryError(BiencoderError, ValueError):
    """Nothing to summarise, or logs that cannot be read; the message says what to do."""
