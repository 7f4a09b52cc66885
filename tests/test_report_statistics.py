"""The statistics of the comparisons (biencoder.report.statistics) on inputs whose answers are known."""

import numpy as np
import pytest

from biencoder.report.statistics import bootstrap_ci, holm, paired_bootstrap, verdict, wilson


def test_bootstrap_known_answers():
    ones, zeros = np.ones(50), np.zeros(50)
    diff, low, high, p = paired_bootstrap(ones, zeros)
    assert (diff, low, high, p) == (1.0, 1.0, 1.0, 0.0)
    same = np.random.default_rng(0).integers(0, 2, 300).astype(float)
    diff, low, high, p = paired_bootstrap(same, same)
    assert (diff, low, high) == (0.0, 0.0, 0.0) and p == 1.0 and verdict(diff, p) == "no significant difference"
    # Bernoulli(0.6), n = 2000: the normal approximation gives a half-width of 1.96·sqrt(.24/2000) ≈ 0.0215
    x = np.zeros(2000)
    x[:1200] = 1
    mean, low, high = bootstrap_ci(x, n_boot=4000)
    assert mean == 0.6 and low == pytest.approx(0.6 - 0.0215, abs=0.004) and high == pytest.approx(0.6 + 0.0215, abs=0.004)
    assert verdict(-0.05, 0.01) == "worse" and verdict(0.05, 0.01) == "better" and verdict(0.05, 0.2) != "better"


def test_two_level_bootstrap_sees_seed_variation():
    """Three seeds whose models disagree completely (all queries right, all wrong, all right): a query-level
    bootstrap calls the mean exact, a seeds-then-queries bootstrap spreads it over the 4 values 0, 1/3, 2/3, 1."""
    hits = np.array([np.ones(400), np.zeros(400), np.ones(400)])
    assert bootstrap_ci(hits, n_boot=4000, two_level=False)[1:] == (pytest.approx(2 / 3), pytest.approx(2 / 3))
    mean, low, high = bootstrap_ci(hits, n_boot=4000)  # 3 seeds: two levels by default
    assert mean == pytest.approx(2 / 3) and low == 0.0 and high == 1.0  # P(all three draws = seed 2) = 1/27 > 2.5%
    # paired: a difference that one seed in three shows is not significant at the seed level
    a, b = np.array([np.ones(400), np.zeros(400), np.zeros(400)]), np.zeros((3, 400))
    assert paired_bootstrap(a, b, n_boot=4000, two_level=False)[3] == 0.0
    assert paired_bootstrap(a, b, n_boot=4000)[3] > 0.05


def test_holm_on_known_p_values():
    # sorted 0.01, 0.03, 0.04 -> x3, x2, x1 = 0.03, 0.06, 0.04 -> monotone 0.03, 0.06, 0.06
    np.testing.assert_allclose(holm([0.01, 0.04, 0.03]), [0.03, 0.06, 0.06])
    np.testing.assert_allclose(holm([0.5, 0.9]), [1.0, 1.0])
    assert holm([0.02]).tolist() == [0.02]


def test_wilson_on_known_intervals():
    """0 of 10: the upper end is z²/(n+z²) = 0.2775; 15 of 30: symmetric around 0.5, half-width 0.1685 (by hand:
    1.96·sqrt(0.25/30 + 1.96²/3600) / (1 + 1.96²/30)); no queries: no interval."""
    low, high = wilson(0, 10)
    assert low == pytest.approx(0.0, abs=1e-12) and high == pytest.approx(3.8415 / 13.8415, abs=1e-4)
    low, high = wilson(15, 30)
    assert low == pytest.approx(0.5 - 0.1685, abs=1e-4) and high == pytest.approx(0.5 + 0.1685, abs=1e-4)
    assert all(np.isnan(wilson(0, 0)))
