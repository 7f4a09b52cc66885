"""Statistics of the run comparisons, in plain numpy: bootstrap intervals (one or two levels), the paired bootstrap
test with the Monte Carlo range of its p-value (of a difference of two cells, or of a contrast of several: the
factorial effects), Holm's adjustment, the verdict in words, and the Wilson interval of one run's top-1.

Inputs are arrays of per-query outcomes: [Q] for one run, [S, Q] for S seeds (rows) of one cell. Nothing here
reads files or knows about runs; :mod:`biencoder.report.tables` feeds it.

Every table uses :data:`N_BOOT` resamples unless a person asks for another number, so the same runs get the same
p-values and verdicts whichever command prints them. A p-value estimated from resamples is itself uncertain; its
range (:func:`p_range`) is printed beside it, and a verdict whose Holm-adjusted range straddles α is "at the line"
(:func:`verdict`), never "better" or "worse".
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from . import SummaryError

#: fewer seeds than this: intervals resample test queries only, and no claim about training randomness is made
MIN_SEEDS_FOR_SEED_LEVEL = 3
#: bootstrap resamples of every interval and p-value the reports print (the sweep-end table, plot_top1.py,
#: compare_baselines.py): one setting, so a verdict never depends on which command drew the table. With 100 000
#: a p-value near 0.05 is known to ±0.003 (:data:`MC_Z` Monte Carlo standard errors; ±0.005 for a Holm-adjusted
#: p of three comparisons), so only comparisons that close to α are "at the line". The resampling draws counts of
#: the distinct per-query outcomes, not of the queries, so this many cost well under a second per comparison.
N_BOOT = 100_000
#: the Monte Carlo range of a p-value spans this many standard errors either side (Wilson interval of the share)
MC_Z = 3.0
#: α of every verdict
ALPHA = 0.05


def _multinomial(rng: np.random.Generator, freq: np.ndarray, size: int) -> np.ndarray:
    """[size, L] draws of how often each of L values is picked when ``freq.sum()`` items are drawn with replacement
    from items of which ``freq`` [L] (integers) show each value: the multinomial as L − 1 conditional binomials,
    each vectorised over the rows (numpy's ``multinomial`` loops over rows one at a time)."""
    counts = np.empty((size, len(freq)))
    left, rest = np.full(size, int(freq.sum())), int(freq.sum())
    for j, f in enumerate(freq[:-1]):
        counts[:, j] = rng.binomial(left, f / rest)
        left = left - counts[:, j].astype(int)
        rest -= int(f)
    counts[:, -1] = left
    return counts


def _bootstrap_stats(values: np.ndarray, n_boot: int, seed: int, two_level: bool) -> np.ndarray:
    """[n_boot] resampled means of ``values`` [S, Q]. One level: queries resampled, seeds averaged. Two levels:
    seeds resampled (with replacement), then queries, so the spread includes training randomness."""
    rng = np.random.default_rng(seed)
    n_seeds, q = values.shape
    # A resample's mean is (1 / (S·Q)) Σ_q count_q · (w · values[:, q]), w the multiplicity of each seed in the
    # drawn seeds (all ones at one level) and count_q how often query q is drawn: it depends only on how often each
    # distinct per-query value w · values[:, q] is drawn. So the resamples are grouped by their seed multiset (126 for
    # five seeds) and drawn as counts over those few values (at most 2S+1 for hits and their differences): the
    # same distribution as counts over the thousands of queries, at a fraction of the cost.
    if two_level:
        drawn = rng.integers(0, n_seeds, size=(n_boot, n_seeds))
        weights = np.bincount(
            (drawn + n_seeds * np.arange(n_boot)[:, None]).ravel(), minlength=n_boot * n_seeds
        ).reshape(n_boot, n_seeds)
        # one integer per multiset (base S+1 digits), so grouping is a 1-D unique
        _, first, group = np.unique(
            weights @ (n_seeds + 1) ** np.arange(n_seeds), return_index=True, return_inverse=True
        )
        multisets = weights[first]
    else:
        multisets, group = np.ones((1, n_seeds)), np.zeros(n_boot, dtype=int)
    order = np.argsort(group.reshape(-1), kind="stable")
    bounds = np.searchsorted(group.reshape(-1)[order], np.arange(len(multisets) + 1))
    out = np.empty(n_boot)
    for g, w in enumerate(multisets):
        rows = order[bounds[g] : bounds[g + 1]]
        levels, freq = np.unique(w @ values, return_counts=True)  # [L]: the per-query values and their counts
        # sums, divided once at the end: integer outcomes give exact sums, so a resampled difference of exactly 0
        # counts as 0 (on both sides of the p-value), never as a rounding error of either sign
        out[rows] = _multinomial(rng, freq, len(rows)) @ levels / (q * n_seeds)
    return out


def wilson(hits: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score interval of a proportion ``hits``/``n`` (95 % with the default ``z``): one run's top-1 over its
    queries, or the share behind a bootstrap p-value (:func:`p_range`)."""
    if n == 0:
        return float("nan"), float("nan")
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return float(centre - half), float(centre + half)


def bootstrap_ci(
    values: np.ndarray, n_boot: int = N_BOOT, seed: int = 0, level: float = 0.95, two_level: bool | None = None
) -> tuple[float, float, float]:
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


def paired_bootstrap(
    a: np.ndarray, b: np.ndarray, n_boot: int = N_BOOT, seed: int = 0, two_level: bool | None = None
) -> tuple[float, float, float, float]:
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


def contrast_bootstrap(
    values: list[np.ndarray], weights: list[Fraction | int], n_boot: int = N_BOOT, seed: int = 0
) -> tuple[float, float, float, float]:
    """A contrast of cell means, Σ_c w_c · mean(values_c): (effect, low, high, p), by :func:`paired_bootstrap`.

    ``values``: one array per cell, [Q] or [S, Q] per-query outcomes, all of one shape (seeds matched row by row,
    the same queries); ``weights``: one rational weight per cell (ints or :class:`~fractions.Fraction`), e.g. 1, −1
    for a difference (then the result is ``paired_bootstrap(a, b)``'s, number for number). The cells of positive
    weight make one side of a paired comparison and those of negative weight the other, each the sum of its hits
    times its weight scaled by the weights' common denominator: integer outcomes stay exact sums, so a resampled
    effect of exactly 0 counts as 0, never as a rounding error of either sign. Queries (and, with
    :data:`MIN_SEEDS_FOR_SEED_LEVEL`+ seeds, seeds) are resampled jointly for every cell. Returns the effect with
    its 95 % interval (in the units of ``values``) and the two-sided bootstrap p of "no effect". Raises
    :class:`SummaryError` when the cells' shapes differ.
    """
    arrays = [np.atleast_2d(np.asarray(v, dtype=float)) for v in values]
    if len(arrays) != len(weights) or len({a.shape for a in arrays}) != 1:
        raise SummaryError(
            f"cannot contrast cells of shapes {sorted({a.shape for a in arrays})} (seeds × test queries) with "
            f"{len(weights)} weights: the runs used different test splits or seeds"
        )
    fractions = [Fraction(w) for w in weights]
    scale = math.lcm(*(f.denominator for f in fractions))
    sides = [np.zeros_like(arrays[0]), np.zeros_like(arrays[0])]
    for w, a in zip(fractions, arrays, strict=True):
        sides[int(w < 0)] += abs(int(w * scale)) * a
    effect, low, high, p = paired_bootstrap(sides[0], sides[1], n_boot, seed)
    return effect / scale, low / scale, high / scale, p


def holm(p_values) -> np.ndarray:
    """Holm–Bonferroni adjusted p-values (same order as given): step-down, monotone, capped at 1."""
    p = np.asarray(p_values, dtype=float)
    order = np.argsort(p, kind="stable")
    adjusted = np.maximum.accumulate((len(p) - np.arange(len(p))) * p[order])
    out = np.empty_like(p)
    out[order] = np.minimum(adjusted, 1.0)
    return out


def p_range(p: float, n_boot: int = N_BOOT, z: float = MC_Z) -> tuple[float, float]:
    """(low, high): the Monte Carlo range of a bootstrap p-value ``p`` of :func:`paired_bootstrap` drawn from
    ``n_boot`` resamples. ``p`` is twice a share of resamples, so the range is twice the Wilson interval (``z``
    standard errors) of that share, capped at 1; it is what another bootstrap seed or resample count could give,
    not a statement about the runs. A p of 0 still has a range above 0 (no resample crossed 0 *in this draw*)."""
    share = min(p, 1.0) / 2
    low, high = wilson(round(share * n_boot), n_boot, z)
    return float(max(0.0, 2 * low)), float(min(1.0, 2 * high))


def holm_ranges(p_values, n_boot: int = N_BOOT) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) of the Holm-adjusted p-values: :func:`holm` of the low and of the high ends of each p's
    :func:`p_range` (the adjustment is monotone in every p, so the adjusted value lies between them)."""
    ranges = np.array([p_range(p, n_boot) for p in np.asarray(p_values, dtype=float)]).reshape(-1, 2)
    return holm(ranges[:, 0]), holm(ranges[:, 1])


def p_text(p: float, low: float, high: float) -> str:
    """A p-value with its Monte Carlo range as the tables print it: ``0.0436 [0.0391, 0.0485]``."""
    return f"{p:.4f} [{low:.4f}, {high:.4f}]"


#: the verdict of a comparison whose Holm-adjusted p-value range contains α: more resamples would decide it
AT_THE_LINE = "at the line"


def verdict(
    diff: float, p_adjusted: float, alpha: float = ALPHA, p_adjusted_range: tuple[float, float] | None = None
) -> str:
    """Plain words for a comparison with difference ``diff`` and Holm-adjusted p ``p_adjusted``, whose Monte Carlo
    range is ``p_adjusted_range`` (:func:`holm_ranges`; None: the p is exact). better / worse: the whole range is
    below ``alpha``; no significant difference: all of it is at or above; :data:`AT_THE_LINE`: it straddles
    ``alpha``, so the verdict would depend on the resampling, not on the runs."""
    low, high = (p_adjusted, p_adjusted) if p_adjusted_range is None else p_adjusted_range
    if low >= alpha:
        return "no significant difference"
    if high >= alpha:
        return AT_THE_LINE
    return "better" if diff > 0 else "worse"


def verdicts(diffs, p_values, n_boot: int = N_BOOT, alpha: float = ALPHA) -> dict[str, list]:
    """One Holm family: the columns a comparison table adds for p-values ``p_values`` of differences ``diffs``
    (each from ``n_boot`` resamples): ``p_low``/``p_high`` (:func:`p_range`), ``p_holm`` with its range
    ``p_holm_low``/``p_holm_high`` (:func:`holm_ranges`), and ``verdict``."""
    p = np.asarray(p_values, dtype=float)
    ranges = np.array([p_range(v, n_boot) for v in p]).reshape(-1, 2)
    adjusted, low, high = holm(p), holm(ranges[:, 0]), holm(ranges[:, 1])  # holm_ranges, the ranges made once
    return {
        "p_low": list(ranges[:, 0]),
        "p_high": list(ranges[:, 1]),
        "p_holm": list(adjusted),
        "p_holm_low": list(low),
        "p_holm_high": list(high),
        "verdict": [verdict(d, a, alpha, (lo, hi)) for d, a, lo, hi in zip(diffs, adjusted, low, high, strict=True)],
    }
