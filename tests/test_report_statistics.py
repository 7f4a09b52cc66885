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


def test_resampling_is_seeded_and_its_seed_is_0_by_default():
    """Every table resamples with the default seed (0): the same call gives the same interval and p, another seed
    another one."""
    rng = np.random.default_rng(3)
    a, b = rng.integers(0, 2, (2, 300)).astype(float), rng.integers(0, 2, (2, 300)).astype(float)
    ci = bootstrap_ci(a, n_boot=500)
    assert ci == bootstrap_ci(a, n_boot=500) == bootstrap_ci(a, n_boot=500, seed=0)
    assert ci != bootstrap_ci(a, n_boot=500, seed=1)
    test = paired_bootstrap(a, b, n_boot=500)
    assert test == paired_bootstrap(a, b, n_boot=500) == paired_bootstrap(a, b, n_boot=500, seed=0)
    assert test != paired_bootstrap(a, b, n_boot=500, seed=1)


@pytest.mark.parametrize("seeds", [1, 2, 3])
def test_seeds_are_resampled_from_three_seeds_on(seeds):
    """The default level is decided by the number of seeds (rows), whatever the number of queries."""
    rng = np.random.default_rng(4)
    a, b = rng.integers(0, 2, (seeds, 50)).astype(float), rng.integers(0, 2, (seeds, 50)).astype(float)
    two_level = seeds >= 3
    assert bootstrap_ci(a, n_boot=500) == bootstrap_ci(a, n_boot=500, two_level=two_level)
    assert paired_bootstrap(a, b, n_boot=500) == paired_bootstrap(a, b, n_boot=500, two_level=two_level)
    if seeds == 2:  # the other level gives another interval here (with one seed both are the same)
        assert bootstrap_ci(a, n_boot=500) != bootstrap_ci(a, n_boot=500, two_level=True)


def test_the_seed_level_draws_every_seed():
    """Seed 0 alone got every query right, seeds 1 and 2 none: P(no draw of seed 0) = (2/3)³ ≈ 0.30, so the 95 %
    interval runs from 0 to at least 1/3."""
    hits = np.array([np.ones(200), np.zeros(200), np.zeros(200)])
    mean, low, high = bootstrap_ci(hits, n_boot=4000)
    assert mean == pytest.approx(1 / 3) and low == 0.0 and high >= 1 / 3


def test_interval_level_by_the_normal_approximation():
    """A 50 % interval of a Bernoulli(0.6) mean over 2000 queries: ±0.674·sqrt(.24/2000) = ±0.0074."""
    x = np.zeros(2000)
    x[:1200] = 1
    mean, low, high = bootstrap_ci(x, n_boot=20000, level=0.5)
    assert (high - low) / 2 == pytest.approx(0.674 * np.sqrt(0.24 / 2000), abs=0.0012)


def test_p_value_by_hand():
    """One query of four differs: a resample leaves it out with probability (3/4)⁴ = 0.316, the only way to a
    difference ≤ 0, so p = 2 · 0.316 = 0.633."""
    diff, low, high, p = paired_bootstrap(np.array([1.0, 0, 0, 0]), np.zeros(4), n_boot=20000)
    assert diff == 0.25 and (low, high) == (0.0, 0.75)
    assert p == pytest.approx(2 * 0.75 ** 4, abs=0.02)


def test_unmatched_seeds_compare_the_seed_means():
    """3 seeds against 2 (no seed in common): each side's mean over its seeds, query by query, then one level."""
    a = np.array([[1.0, 1, 0, 0], [1, 0, 1, 0], [1, 0, 0, 1]])  # per query: 1, 1/3, 1/3, 1/3
    b = np.array([[0.0, 1, 1, 0], [0, 1, 0, 0]])  # per query: 0, 1, 1/2, 0
    diff, low, high, p = paired_bootstrap(a, b, n_boot=2000)
    assert diff == pytest.approx((1 - 2 / 3 - 1 / 6 + 1 / 3) / 4)
    assert (diff, low, high, p) == paired_bootstrap(a.mean(axis=0), b.mean(axis=0), n_boot=2000)


def test_unpaired_query_counts_are_refused():
    from biencoder.report import SummaryError

    with pytest.raises(SummaryError, match=r"^cannot pair 3 with 4 queries"):
        paired_bootstrap(np.ones(3), np.ones(4))


def test_holm_caps_at_one_and_alpha_itself_is_not_significant():
    np.testing.assert_allclose(holm([0.6, 0.9]), [1.0, 1.0])  # 2 · 0.6 = 1.2
    assert verdict(0.1, 0.05) != "better" and verdict(-0.1, 0.05) != "worse"  # p = α: not below it
