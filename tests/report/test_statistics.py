"""The statistics of the comparisons (biencoder.report.statistics) on inputs whose answers are known."""

import inspect
from fractions import Fraction

import numpy as np
import pytest
from omegaconf import OmegaConf

import biencoder.summary
from biencoder.callbacks import SweepSummary
from biencoder.report import SummaryError
from biencoder.report.baselines import baseline_table
from biencoder.report.factorial import factorial_table
from biencoder.report.runs import assign_cells, find_runs
from biencoder.report.statistics import (
    AT_THE_LINE,
    N_BOOT,
    _bootstrap_stats,
    bootstrap_ci,
    contrast_bootstrap,
    holm,
    holm_ranges,
    p_range,
    paired_bootstrap,
    verdict,
    wilson,
)
from biencoder.report.tables import _comparisons_markdown, paired_comparisons, summary_table
from helpers import write_run


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
    assert (
        mean == 0.6
        and low == pytest.approx(0.6 - 0.0215, abs=0.004)
        and high == pytest.approx(0.6 + 0.0215, abs=0.004)
    )
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


# -- one resampling setting, and the Monte Carlo error of p ------------------------------------------------------


def test_p_range_by_hand():
    """p = 0.05 from 100 000 resamples is a share of 2500: Wilson at z = 3 gives centre (0.025 + 9/2e5)/(1 + 9e-5)
    = 0.0250427 and half-width 3·sqrt(0.025·0.975/1e5 + 9/4e10)/(1 + 9e-5) = 0.0014817, doubled: [0.04712, 0.05305].
    A p of 0 from 1000 resamples is not exactly 0: its high end is 2·9/1009."""
    assert p_range(0.05, 100_000) == pytest.approx((0.047122, 0.053049), abs=2e-6)
    assert p_range(0.0, 1000) == (0.0, pytest.approx(18 / 1009))
    assert p_range(1.0, 1000)[1] == 1.0
    # the range narrows as 1/sqrt(resamples): 100x the resamples, a tenth of the width
    wide, narrow = p_range(0.05, 1000), p_range(0.05, 100_000)
    assert (wide[1] - wide[0]) / (narrow[1] - narrow[0]) == pytest.approx(10, rel=0.05)
    lows, highs = holm_ranges([0.01, 0.04], 10_000)
    assert lows.tolist() == pytest.approx(holm([p_range(0.01, 10_000)[0], p_range(0.04, 10_000)[0]]).tolist())
    assert np.all(lows <= holm([0.01, 0.04])) and np.all(holm([0.01, 0.04]) <= highs)


def test_a_verdict_whose_range_straddles_alpha_is_at_the_line():
    assert verdict(0.02, 0.048, p_adjusted_range=(0.045, 0.051)) == AT_THE_LINE
    assert verdict(0.02, 0.052, p_adjusted_range=(0.049, 0.055)) == AT_THE_LINE
    assert verdict(-0.02, 0.048, p_adjusted_range=(0.046, 0.0499)) == "worse"
    assert verdict(0.02, 0.051, p_adjusted_range=(0.05, 0.052)) == "no significant difference"


def _planted_runs(tmp_path):
    """One seed of relu and plain on 400 test queries: relu alone right on 55, plain alone on 36. The normal
    approximation puts the two-sided p at 2·Φ(−2.00) ≈ 0.045-0.05: a case at α, one comparison (p_holm = p)."""
    relu, plain = np.zeros(400, bool), np.zeros(400, bool)
    relu[:55], plain[55:91] = True, True
    write_run(tmp_path / "relu", "relu", 0, [0.2], [relu.mean()], relu)
    write_run(tmp_path / "plain", "plain", 0, [0.2], [plain.mean()], plain)
    runs = find_runs([tmp_path])
    assign_cells(runs)
    return runs


def test_a_planted_comparison_at_alpha_is_never_called_better(tmp_path):
    """A verdict from the estimated p alone says "better" here (p 0.042 from 2000 resamples, 0.047 from 10 000),
    though the p-value's own Monte Carlo error spans 0.05. With the default resamples, and with 2000, the verdict is
    "at the line", and the table prints the range beside p."""
    runs = _planted_runs(tmp_path)
    for n_boot in (N_BOOT, 2000):
        row = (paired_comparisons(runs) if n_boot == N_BOOT else paired_comparisons(runs, n_boot=n_boot)).iloc[0]
        assert row["cell"] == "relu" and row["diff_test_top1"] == pytest.approx(19 / 400)
        assert row["p_holm_low"] < 0.05 <= row["p_holm_high"] and row["p_low"] <= row["p"] <= row["p_high"]
        assert row["verdict"] == AT_THE_LINE, (n_boot, row["p"])
    comparisons = paired_comparisons(runs)
    line = next(line for line in _comparisons_markdown(comparisons).splitlines() if line.startswith("| relu |"))
    c = comparisons.iloc[0]
    assert f"{c['p']:.4f} [{c['p_low']:.4f}, {c['p_high']:.4f}]" in line and "| at the line |" in line


def test_every_table_resamples_the_same_number_of_times(tmp_path, monkeypatch):
    """One default, written once: the statistics, the tables, the plot command and the sweep-end summary (which
    calls the plot command with no --n-boot of its own) all use N_BOOT."""
    for fn in (
        bootstrap_ci,
        paired_bootstrap,
        contrast_bootstrap,
        summary_table,
        paired_comparisons,
        baseline_table,
        factorial_table,
    ):
        assert inspect.signature(fn).parameters["n_boot"].default == N_BOOT, fn.__name__
    assert biencoder.summary.parser().parse_args(["logs"]).n_boot == N_BOOT
    calls = []
    monkeypatch.setattr(biencoder.summary, "main", lambda argv: calls.append(argv) or 0)
    (tmp_path / "sweep" / "0_plain_s0").mkdir(parents=True)
    (tmp_path / "sweep" / "0_plain_s0" / "final.json").write_text("{}")
    SweepSummary().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path / "sweep")}}}))
    assert calls == [[str(tmp_path / "sweep")]]


def test_counting_patterns_resamples_like_counting_queries():
    """The resampling draws counts of the distinct per-query values, not of the queries: the spread of the resampled
    mean must still be the textbook one, sqrt(population variance / Q) (one level), for hits and for a difference."""
    rng = np.random.default_rng(1)
    hits = (rng.random((5, 700)) < 0.3).astype(float)
    other = (rng.random((5, 700)) < 0.3).astype(float)
    for values in (hits, hits - other):
        stats = _bootstrap_stats(values, 40_000, 0, two_level=False)
        exact = np.sqrt(values.mean(axis=0).var() / values.shape[1])
        assert stats.mean() == pytest.approx(values.mean(), abs=3 * exact / 200)
        assert stats.std() == pytest.approx(exact, rel=0.02)


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
    assert p == pytest.approx(2 * 0.75**4, abs=0.02)


def test_a_contrast_is_the_paired_bootstrap_of_its_two_sides():
    """A difference of two cells as a contrast (1, −1) is paired_bootstrap's result, number for number; a contrast of
    four cells with weights ±1/2 is in the units of the cell means: one query of four is 1 in the first cell and 0
    elsewhere, so the effect is 1/2 · 1/4 with the interval [0, 3/8] and the p of test_p_value_by_hand; where it is
    1 at every query, both bounds are the effect, 1/2. The seed given is the resampling's (mutants that drop it or
    scale a bound the wrong way survived without these two)."""
    rng = np.random.default_rng(5)
    a, b = rng.integers(0, 2, (5, 300)).astype(float), rng.integers(0, 2, (5, 300)).astype(float)
    assert contrast_bootstrap([a, b], [1, -1], n_boot=2000) == paired_bootstrap(a, b, n_boot=2000)
    # the seed reaches the resampling: another seed, another interval, and paired_bootstrap's of that seed
    reseeded = contrast_bootstrap([a, b], [1, -1], n_boot=2000, seed=3)
    assert reseeded == paired_bootstrap(a, b, n_boot=2000, seed=3) != paired_bootstrap(a, b, n_boot=2000)
    first, zero = np.array([1.0, 0, 0, 0]), np.zeros(4)
    half = Fraction(1, 2)
    effect, low, high, p = contrast_bootstrap([first, zero, zero, zero], [half, -half, -half, half], n_boot=20000)
    assert (effect, low, high) == (1 / 8, 0.0, 3 / 8)
    assert p == pytest.approx(2 * 0.75**4, abs=0.02)
    # every query 1 in the first cell: no resample moves the effect, so both bounds are it, in the cells' units
    one = np.ones(4)
    assert contrast_bootstrap([one, zero, zero, zero], [half, -half, -half, half], n_boot=200) == (0.5, 0.5, 0.5, 0.0)


def test_a_contrast_of_equal_cells_is_exactly_zero_whatever_its_weights():
    """Ten equal cells at 1/10 each against the same cell at −1: in floats 10 × 0.1 is not 1 and every resample
    would fall below 0 (p = 0); the weights are scaled to integers, so the effect is 0 and p is 1."""
    hits = np.random.default_rng(6).integers(0, 2, (3, 200)).astype(float)
    assert contrast_bootstrap([hits] * 11, [Fraction(1, 10)] * 10 + [-1], n_boot=1000) == (0.0, 0.0, 0.0, 1.0)


def test_a_contrast_of_cells_on_other_queries_is_refused():
    with pytest.raises(SummaryError, match="cannot contrast cells of shapes"):
        contrast_bootstrap([np.zeros((2, 5)), np.zeros((2, 6))], [1, -1])
    with pytest.raises(SummaryError, match="with 3 weights"):
        contrast_bootstrap([np.zeros(5), np.zeros(5)], [1, -1, 0])


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


def test_verdicts_take_the_p_ranges_of_their_own_resamples():
    """A comparison table drawn with --n-boot 1000 prints the Monte Carlo range of 1000 resamples, not of N_BOOT.
    By hand (z = 3, n = 1000, z² = 9): p = 0.03 is a share of 15: centre (0.015 + 9/2000)/(1 + 9/1000) = 0.0193261,
    half-width 3·sqrt(0.015·0.985/1000 + 9/4e6)/1.009 = 0.0122680, doubled: [0.014116, 0.063188]; p = 0.2 a share of
    100: centre 0.1045/1.009 = 0.1035679, half-width 3·sqrt(9e-5 + 2.25e-6)/1.009 = 0.0285571: [0.150022, 0.264250].
    Holm over the two (0.03 first, x2; 0.2 x1): p_holm (0.06, 0.2), lows (0.028232, 0.150022), highs (0.126376,
    0.264250). The first range straddles 0.05: at the line; the second is above it. From N_BOOT resamples the first's
    Holm range would be [0.0556, 0.0648]: no significant difference."""
    from biencoder.report.statistics import verdicts

    got = verdicts([0.02, -0.01], [0.03, 0.2], n_boot=1000)
    assert got["p_low"] == pytest.approx([0.014116, 0.150022], abs=2e-6)
    assert got["p_high"] == pytest.approx([0.063188, 0.264250], abs=2e-6)
    assert got["p_holm"] == pytest.approx([0.06, 0.2])
    assert got["p_holm_low"] == pytest.approx([0.028232, 0.150022], abs=2e-6)
    assert got["p_holm_high"] == pytest.approx([0.126376, 0.264250], abs=2e-6)
    assert got["verdict"] == [AT_THE_LINE, "no significant difference"]


def test_verdicts_of_more_differences_than_p_values_are_refused_not_cut_short():
    """One verdict per difference: a difference without its p-value (or a p-value without its difference) is a
    caller's error, refused, not a table that silently lacks the rows past the shorter of the two."""
    from biencoder.report.statistics import verdicts

    with pytest.raises(ValueError, match="zip"):
        verdicts([0.02, -0.01, 0.03], [0.03, 0.2], n_boot=1000)
    with pytest.raises(ValueError, match="zip"):
        verdicts([0.02], [0.03, 0.2], n_boot=1000)
    assert len(verdicts([0.02, -0.01], [0.03, 0.2], n_boot=1000)["verdict"]) == 2


def test_a_range_that_ends_at_alpha_is_at_the_line():
    """better / worse need the whole range below α; a high end equal to α is not below it (as a p equal to α is not
    significant), so the verdict is at the line, whichever the sign of the difference."""
    assert verdict(0.02, 0.04, p_adjusted_range=(0.03, 0.05)) == AT_THE_LINE
    assert verdict(-0.02, 0.04, p_adjusted_range=(0.03, 0.05)) == AT_THE_LINE
    assert verdict(0.02, 0.04, p_adjusted_range=(0.03, 0.0499)) == "better"
