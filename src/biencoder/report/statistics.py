"""Statistics of the run comparisons, in plain numpy: bootstrap intervals (one or two levels), the paired bootstrap
test, Holm's adjustment, the verdict in words, and the Wilson interval of one run's top-1.

Inputs are arrays of per-query outcomes: [Q] for one run, [S, Q] for S seeds (rows) of one cell. Nothing here
reads files or knows about runs; :mod:`biencoder.report.tables` feeds it.
"""

from __future__ import annotations

import numpy as np

from . import SummaryError

#: fewer seeds than this: intervals resample test queries only, and no claim about training randomness is made
MIN_SEEDS_FOR_SEED_LEVEL = 3


def _bootstrap_stats(values: np.ndarray, n_boot: int, seed: int, two_level: bool) -> np.ndarray:
    """[n_boot] resampled means of ``values`` [S, Q]. One level: queries resampled, seeds averaged. Two levels:
    seeds resampled (with replacement), then queries, so the spread includes training randomness."""
    rng = np.random.default_rng(seed)
    n_seeds, q = values.shape
    # query resampling as multinomial counts: per resample, each seed's mean over the drawn queries
    counts = rng.multinomial(q, np.full(q, 1.0 / q), size=n_boot)  # [n_boot, Q]
    per_seed = counts @ values.T / q  # [n_boot, S]
    if not two_level:
        return per_seed.mean(axis=1)
    seeds = rng.integers(0, n_seeds, size=(n_boot, n_seeds))
    return np.take_along_axis(per_seed, seeds, axis=1).mean(axis=1)


def wilson(hits: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """95 % Wilson score interval of a proportion ``hits``/``n`` (one run's top-1 over its queries)."""
    if n == 0:
        return float("nan"), float("nan")
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return float(centre - half), float(centre + half)


def bootstrap_ci(values: np.ndarray, n_boot: int = 10000, seed: int = 0, level: float = 0.95,
                 two_level: bool | None = None) -> tuple[float, float, float]:
    """(mean, low, high) of ``values`` [Q] or [S, Q] (seeds × queries).

    ``two_level`` (default: when there are at least :data:`MIN_SEEDS_FOR_SEED_LEVEL` seeds) resamples seeds and
    then queries; otherwise queries only, with the seeds averaged (an interval over test queries for fixed models).
    """
    values = np.atleast_2d(np.asarray(values, dtype=float))
    if two_level is None:
        two_level = values.shape[0] >= MIN_SEEDS_FOR_SEED_LEVEL
    stats = _bootstrap_stats(values, n_boot, seed, two_level)
    alpha = (1 - level) / 2
    return float(values.mean()), float(np.quantile(stats, alpha)), float(np.quantile(stats, 1 - alpha))


def paired_bootstrap(a: np.ndarray, b: np.ndarray, n_boot: int = 10000, seed: int = 0,
                     two_level: bool | None = None) -> tuple[float, float, float, float]:
    """Difference of means a − b: (diff, low, high, p). ``a``, ``b``: [Q] or [S, Q] per-query hits with seeds
    matched row by row; queries (and, with ``two_level``, seeds) are resampled jointly for both. ``p`` is the
    two-sided bootstrap p-value of "no difference": twice the smaller share of resampled differences on either
    side of 0 (capped at 1)."""
    a, b = np.atleast_2d(np.asarray(a, dtype=float)), np.atleast_2d(np.asarray(b, dtype=float))
    if a.shape[1] != b.shape[1]:
        raise SummaryError(f"cannot pair {a.shape[1]} with {b.shape[1]} queries: the runs used different test splits")
    if a.shape[0] != b.shape[0]:  # unmatched seeds: compare the seed means
        a, b = a.mean(axis=0, keepdims=True), b.mean(axis=0, keepdims=True)
    d = a - b
    if two_level is None:
        two_level = d.shape[0] >= MIN_SEEDS_FOR_SEED_LEVEL
    stats = _bootstrap_stats(d, n_boot, seed, two_level)
    p = min(1.0, 2 * min((stats <= 0).mean(), (stats >= 0).mean()))
    return float(d.mean()), float(np.quantile(stats, 0.025)), float(np.quantile(stats, 0.975)), float(p)


def holm(p_values) -> np.ndarray:
    """Holm–Bonferroni adjusted p-values (same order as given): step-down, monotone, capped at 1."""
    p = np.asarray(p_values, dtype=float)
    order = np.argsort(p, kind="stable")
    adjusted = np.maximum.accumulate((len(p) - np.arange(len(p))) * p[order])
    out = np.empty_like(p)
    out[order] = np.minimum(adjusted, 1.0)
    return out


def verdict(diff: float, p_adjusted: float, alpha: float = 0.05) -> str:
    """Plain words: better / worse when the adjusted p is below ``alpha``, else no significant difference."""
    if p_adjusted >= alpha:
        return "no significant difference"
    return "better" if diff > 0 else "worse"
