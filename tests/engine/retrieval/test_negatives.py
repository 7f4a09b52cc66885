import numpy as np
import pytest

from biencoder.engine.retrieval.negatives import (
    Mining,
    forbidden_texts,
    mine_negatives,
    random_rate,
    row_block,
)
from biencoder.engine.retrieval.search import SEARCH_BLOCK
from helpers import paired_split


def test_planted_nearest_neighbour_skips_self_counter_and_duplicates():
    # 4 pairs; counter 3 has the same text as counter 0 (a duplicate filed twice)
    split = paired_split(["p0", "p1", "p2", "p3"], ["c0", "c1", "c2", "c0"])
    # 1-D positions: rows 0..3 points, 4..7 counters
    pos = {0: 0.0, 4: 0.1, 7: 0.2, 1: 0.3, 5: 5.0, 2: 9.0, 6: 9.5, 3: 20.0}
    sim = np.array([[pos[r]] for r in range(8)])
    mined = mine_negatives(sim, split, rate=0.0, rng=np.random.default_rng(0), mining=Mining(n_neighbors=1))
    # point 0: own counter (row 4, 0.1) and its duplicate (row 7, 0.2) are skipped → point 1 at 0.3
    # point 1: nearest are row 7 (0.1), row 0 (0.3), row 4 (0.2) → row 7 (0.1)
    # point 2: own counter row 6 skipped; nearest point row 1 (6.3) vs counter row 5 (4.0) → row 5
    # point 3: own counter row 7 AND its text twin row 4 are banned → nearest point row 2 (11), counter 6 (10.5)
    assert mined.row.tolist() == [1, 7, 5, 6]
    assert np.allclose(mined.distance, [0.3, 0.1, 4.0, 10.5])
    assert not mined.is_random.any() and mined.stats()["share_hard"] == 1.0


@pytest.mark.parametrize("rate", [0.0, 0.5, 1.0])
def test_negative_never_has_the_positive_text(rate):
    rng = np.random.default_rng(1)
    counters = [f"c{i % 5}" for i in range(40)]  # heavy duplication of counter texts
    split = paired_split([f"p{i}" for i in range(40)], counters)
    banned = forbidden_texts(split)
    for seed in range(20):
        sim = rng.normal(size=(80, 4))
        mined = mine_negatives(sim, split, rate, np.random.default_rng(seed), Mining(n_neighbors=2))
        assert (mined.row != split.counter).all() and (mined.row != split.query).all()
        assert (split.text_id[mined.row][:, None] != banned).all()
        if rate == 1.0:
            assert mined.is_random.all()
        if rate == 0.0:
            assert not mined.is_random.any()


def test_random_share_follows_rate_and_seed():
    split = paired_split([f"p{i}" for i in range(2000)], [f"c{i}" for i in range(2000)])
    sim = np.random.default_rng(0).normal(size=(4000, 3))
    rng = np.random.default_rng(7)
    a = mine_negatives(sim, split, 0.3, rng)
    b = mine_negatives(sim, split, 0.3, np.random.default_rng(7))
    other = mine_negatives(sim, split, 0.3, np.random.default_rng(8))
    assert np.array_equal(a.row, b.row) and np.array_equal(a.is_random, b.is_random)
    # the generator handed in is the one drawn from: another seed, other pairs and other random rows
    assert (a.is_random != other.is_random).sum() > 100
    both = a.is_random & other.is_random
    assert (a.row[both] != other.row[both]).mean() > 0.9
    assert rng.bit_generator.state != np.random.default_rng(7).bit_generator.state  # it was consumed
    assert abs(a.is_random.mean() - 0.3) < 0.04
    # hard negatives are closer than random ones on average
    assert a.distance[~a.is_random].mean() < a.distance[a.is_random].mean()


def test_random_rate_schedule():
    assert random_rate(0) == 0.8 and random_rate(10) == pytest.approx(0.7)
    assert random_rate(100) == 0.0 and random_rate(5, start=0.5, decay=0.2) == 0.0


@pytest.mark.parametrize("index", ["exact", "balltree"])
def test_only_the_hard_pairs_are_searched_and_they_get_what_a_search_of_all_gives(index):
    """The draw comes first and only the pairs without a random negative are searched (most pairs early on). Their
    negatives must be the ones a search of every pair finds: rate 0 searches all and draws the same RNG stream."""
    q = 700  # 1400 rows: several of exact search's 256-query blocks, a partial one at the end
    split = paired_split([f"p{i}" for i in range(q)], [f"c{i % 650}" for i in range(q)])  # some duplicate counters
    sim = np.random.default_rng(4).normal(size=(2 * q, 16))
    every = mine_negatives(sim, split, 0.0, np.random.default_rng(9), Mining(n_neighbors=3, index=index))
    for rate in (0.3, 0.8):
        mixed = mine_negatives(sim, split, rate, np.random.default_rng(9), Mining(n_neighbors=3, index=index))
        hard = ~mixed.is_random
        assert 0 < hard.sum() < q
        np.testing.assert_array_equal(mixed.row[hard], every.row[hard])
        np.testing.assert_array_equal(mixed.distance[hard], every.distance[hard])


@pytest.mark.parametrize("rate", [0.0, 1.0])
def test_a_pair_without_an_eligible_negative_is_refused_at_any_rate(rate):
    split = paired_split(["a", "a"], ["b", "b"])  # two texts: every argument is a point's or its counter's
    with pytest.raises(ValueError, match="^a pair has no eligible negative"):
        mine_negatives(np.zeros((4, 2)), split, rate, np.random.default_rng(0), Mining(n_neighbors=1))


@pytest.mark.parametrize(
    "points, counters",
    [
        (["a", "a"], ["a", "a"]),  # one text in all
        (["a", "a"], ["a", "b"]),
    ],
)  # pair 0 may take b, pair 1 nothing
def test_one_pair_without_an_eligible_negative_is_enough_to_refuse(points, counters):
    with pytest.raises(ValueError, match="^a pair has no eligible negative"):
        mine_negatives(
            np.zeros((4, 2)), paired_split(points, counters), 0.0, np.random.default_rng(0), Mining(n_neighbors=1)
        )


def test_a_split_smaller_than_the_neighbours_fetched():
    """3 pairs (6 rows) and the default 10 neighbours: one search of all 6 rows finds every hard negative."""
    split = paired_split(["p0", "p1", "p2"], ["c0", "c1", "c2"])
    sim = np.array([[0.0], [10.0], [20.0], [1.0], [11.0], [21.0]])  # rows: p0 p1 p2 c0 c1 c2
    mined = mine_negatives(sim, split, 0.0, np.random.default_rng(0))
    # p0 (0): p1 at 10 before c1 at 11 | p1 (10): c0 at 9 before p2 at 10 | p2 (20): c1 at 9 before p1 at 10
    assert mined.row.tolist() == [1, 3, 4] and mined.distance.tolist() == [10.0, 9.0, 9.0]


def test_random_negatives_are_drawn_from_every_eligible_row():
    split = paired_split(["p0", "p1", "p2"], ["c0", "c1", "c2"])
    drawn = {pair: set() for pair in range(3)}
    for seed in range(100):
        mined = mine_negatives(np.zeros((6, 1)), split, 1.0, np.random.default_rng(seed))
        assert mined.is_random.all() and mined.stats()["random_rate"] == 1.0
        for pair, row in enumerate(mined.row):
            drawn[pair].add(int(row))
    # every row but the pair's own point and counter (rows: p0 p1 p2 c0 c1 c2)
    assert drawn == {0: {1, 2, 4, 5}, 1: {0, 2, 3, 5}, 2: {0, 1, 3, 4}}


def test_float32_vectors_are_measured_in_float64():
    """The runner hands in the float32 sim vectors: the negatives' distances (neg_distance of metrics.jsonl) are
    measured in float64 all the same."""
    split = paired_split([f"p{i}" for i in range(20)], [f"c{i}" for i in range(20)])
    sim = np.random.default_rng(5).normal(size=(40, 8)).astype(np.float32)
    mined = mine_negatives(sim, split, 0.5, np.random.default_rng(1))
    wide = sim.astype(np.float64)
    assert mined.distance.dtype == np.float64
    np.testing.assert_array_equal(mined.distance, np.linalg.norm(wide[split.query] - wide[mined.row], axis=1))


def test_the_random_draw_is_the_first_thing_mining_takes_from_the_rng():
    """Which pairs get a random negative is the first draw of the mining RNG, as before only the hard pairs were
    searched: a change of order would move every same-seed number."""
    split = paired_split([f"p{i}" for i in range(300)], [f"c{i}" for i in range(300)])
    sim = np.random.default_rng(1).normal(size=(600, 4))
    mined = mine_negatives(sim, split, 0.4, np.random.default_rng(11), Mining(n_neighbors=2))
    np.testing.assert_array_equal(mined.is_random, np.random.default_rng(11).random(300) < 0.4)


def test_mining_statistics_by_hand():
    """The per-epoch mining statistics of metrics.jsonl, on four negatives: two random (distances 1 and 8) and two
    hard (2 and 4); an epoch with no hard negative has no hard distance (NaN, without a warning)."""
    import warnings

    from biencoder.engine.retrieval.negatives import MinedNegatives

    mixed = MinedNegatives(
        row=np.array([5, 6, 7, 4]),
        is_random=np.array([True, False, False, True]),
        distance=np.array([1.0, 2.0, 4.0, 8.0]),
        rate=0.3,
    )
    assert mixed.stats() == {
        "random_rate": 0.3,
        "share_random": 0.5,
        "share_hard": 0.5,
        "neg_distance": 3.75,
        "neg_distance_hard": 3.0,
    }
    hard = MinedNegatives(
        row=np.array([5, 6]), is_random=np.array([False, False]), distance=np.array([1.0, 2.0]), rate=0.0
    )
    assert hard.stats() == {
        "random_rate": 0.0,
        "share_random": 0.0,
        "share_hard": 1.0,
        "neg_distance": 1.5,
        "neg_distance_hard": 1.5,
    }
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy warns on the mean of nothing
        stats = MinedNegatives(
            row=np.array([5, 6]), is_random=np.array([True, True]), distance=np.array([1.0, 2.0]), rate=1.0
        ).stats()
    assert stats["share_hard"] == 0.0 and stats["neg_distance"] == 1.5 and np.isnan(stats["neg_distance_hard"])


def test_the_search_says_none_for_a_query_whose_every_text_is_banned():
    """_first_allowed's contract: -1 and inf for a query with no allowed row (mine_negatives refuses such a split
    before searching, so this is the search's own answer, not a reachable negative), the nearest allowed row otherwise,
    past a first k that holds only banned rows (k doubles)."""
    from biencoder.engine.retrieval.negatives import _first_allowed
    from biencoder.engine.retrieval.search import NeighbourIndex

    sim = np.array([[0.0], [1.0], [2.0], [3.0]])
    text_id = np.array([0, 1, 2, 3])
    banned = np.array([[0, 1, 2, 3], [1, 0, 2, 2]])  # query 0: every text; query 1: all but text 3
    for index in ("exact", "balltree"):
        best, dist = _first_allowed(NeighbourIndex(sim, index), sim, np.array([0, 1]), banned, text_id, 1)
        assert best.tolist() == [-1, 3] and dist.tolist() == [np.inf, 2.0]
        assert best.dtype.kind == "i" and dist.dtype.kind == "f"


# -- the selection rules: negatives.relative_margin and negatives.rank_range ---------------------------------------
#: 4 pairs on a line (rows 0..3 points, 4..7 counters). Point 0 sits at 0 and its counter at 1; the other arguments,
#: nearest first from point 0: p1 0.5, c1 1.04, p2 1.2, c2 3, p3 10, c3 10.5 (ranks 1..6 of point 0)
PLANTED = [0.0, 0.5, 1.2, 10.0, 1.0, 1.04, 3.0, 10.5]


def planted(mining: Mining, seed: int = 0) -> np.ndarray:
    split = paired_split(["p0", "p1", "p2", "p3"], ["c0", "c1", "c2", "c3"])
    sim = np.array(PLANTED)[:, None]
    return mine_negatives(sim, split, 0.0, np.random.default_rng(seed), mining).row


@pytest.mark.parametrize(
    "margin, row",
    [
        (None, 1),  # the nearest eligible: p1 at 0.5, nearer than the counter (1)
        (0.0, 5),  # no nearer than the counter: c1 at 1.04
        (0.1, 2),  # at least 1.1: p2 at 1.2
        (2.0, 6),  # at least 3: c2 at exactly 3 passes
        (20.0, 7),  # at least 21: none does, so the farthest eligible, c3 at 10.5
    ],
)
@pytest.mark.parametrize("index", ["exact", "balltree"])
def test_relative_margin_skips_the_candidates_within_it_of_the_positive(margin, row, index):
    assert planted(Mining(n_neighbors=1, index=index, relative_margin=margin))[0] == row


@pytest.mark.slow
@pytest.mark.parametrize(
    "ranks, rows",
    [
        ((1, 1), {1}),  # rank 1: the hardest, as without a range
        ((3, 3), {2}),
        ((2, 4), {5, 2, 6}),  # c1, p2, c2
        ((5, 50), {3, 7}),  # the range past the last candidate: ranks 5..6
        ((9, 12), {7}),  # fewer than lo candidates: the last one
    ],
)
def test_rank_range_draws_uniformly_among_the_ranks_lo_to_hi(ranks, rows):
    drawn = [planted(Mining(n_neighbors=1, rank_range=ranks), seed)[0] for seed in range(300)]
    assert set(drawn) == rows
    counts = np.bincount(drawn)[sorted(rows)]
    assert counts.min() > 300 / len(rows) * 0.7  # uniform: each rank about as often


def test_margin_and_rank_range_together_rank_only_the_candidates_that_pass():
    drawn = {planted(Mining(n_neighbors=1, relative_margin=0.1, rank_range=(1, 2)), seed)[0] for seed in range(100)}
    assert drawn == {2, 6}  # p2 (1.2) and c2 (3): p1 and c1 are within 10 % of the counter's distance


def brute_force(sim, split, mining):
    """Per pair, every eligible row nearest first (stable by row) that passes the margin: the rules by hand."""
    banned, text_id, counter = forbidden_texts(split), split.text_id, split.counter
    out = []
    for pair, point in enumerate(split.query):
        d = np.linalg.norm(sim - sim[point], axis=1)
        floor = 0.0 if mining.relative_margin is None else (1 + mining.relative_margin) * d[counter[pair]]
        order = np.argsort(d, kind="stable")
        keep = ~np.isin(text_id[order], banned[pair]) & (d[order] >= floor)
        out.append(order[keep].tolist())
    return out


@pytest.mark.parametrize("index", ["exact", "balltree"])
@pytest.mark.parametrize(
    "margin, ranks", [(None, (1, 1)), (0.0, None), (0.3, None), (None, (2, 9)), (0.2, (3, 40)), (None, (300, 400))]
)
def test_the_rules_pick_what_a_search_of_every_argument_gives(index, margin, ranks):
    """Against a brute-force ranking, past banned duplicate texts, over two blocks of queries (256, then 44); the
    default rule (a k-nearest search from k=1, by either index) picks what rank 1 picks."""
    q = 300
    split = paired_split([f"p{i}" for i in range(q)], [f"c{i % 250}" for i in range(q)])  # some duplicate counters
    sim = np.random.default_rng(3).normal(size=(2 * q, 3))
    mining = Mining(n_neighbors=1, index=index, relative_margin=margin, rank_range=ranks)
    mined = mine_negatives(sim, split, 0.0, np.random.default_rng(5), mining)
    for pair, candidates in enumerate(brute_force(sim, split, mining)):
        lo, hi = ranks or (1, 1)
        allowed = candidates[lo - 1 : hi] or candidates[-1:]
        assert mined.row[pair] in allowed, pair
    if ranks == (1, 1):  # the nearest eligible: what the default rule picks
        default = mine_negatives(sim, split, 0.0, np.random.default_rng(5), Mining(n_neighbors=1, index=index))
        np.testing.assert_array_equal(mined.row, default.row)


@pytest.mark.parametrize("mining", [Mining(relative_margin=0.05), Mining(rank_range=(10, 50))])
def test_a_seed_gives_the_same_random_negatives_under_every_rule(mining):
    """The rank draws come after the random negatives' draws: which pairs are random and what they got is the same."""
    split = paired_split([f"p{i}" for i in range(400)], [f"c{i}" for i in range(400)])
    sim = np.random.default_rng(2).normal(size=(800, 4))
    default = mine_negatives(sim, split, 0.5, np.random.default_rng(4))
    ruled = mine_negatives(sim, split, 0.5, np.random.default_rng(4), mining)
    np.testing.assert_array_equal(ruled.is_random, default.is_random)
    np.testing.assert_array_equal(ruled.row[ruled.is_random], default.row[default.is_random])
    assert (ruled.row[~ruled.is_random] != default.row[~default.is_random]).mean() > 0.3  # the rule did something


def test_the_record_of_the_planted_negatives():
    """negatives.log's record: the rank among the eligible arguments, both distances, and whether the negative is the
    counter of another pair."""
    from biencoder.engine.retrieval.negative_record import negatives_record, summarise_record

    split = paired_split(["p0", "p1", "p2", "p3"], ["c0", "c1", "c2", "c3"])
    sim = np.array(PLANTED)[:, None]
    mined = mine_negatives(sim, split, 0.0, np.random.default_rng(0), Mining(rank_range=(3, 3)))
    record = negatives_record(sim, split, mined, block=3)  # blocks of 3 queries: one full, one partial
    assert mined.row[0] == 2 and record["rank"][0] == 3  # p2, the third nearest of point 0
    assert record["rank"].tolist() == [3] * 4
    np.testing.assert_allclose(record["distance"][0], 1.2)
    np.testing.assert_allclose(record["positive_distance"], [1.0, 0.54, 1.8, 0.5])
    assert record["positive_of_other"].tolist() == (mined.row >= 4).tolist()
    hardest = mine_negatives(sim, split, 0.0, np.random.default_rng(0))
    assert negatives_record(sim, split, hardest)["rank"].tolist() == [1] * 4
    summary = summarise_record(record, previous=negatives_record(sim, split, hardest))
    assert summary["share_hard"] == 1.0 and summary["median_rank_hard"] == 3.0
    assert summary["share_positive_of_other"] == float(np.mean(mined.row >= 4))
    assert summary["share_same_as_previous"] == float(np.mean(mined.row == hardest.row))
    gap = record["distance"] - record["positive_distance"]
    assert summary["median_gap_hard"] == pytest.approx(float(np.median(gap)))
    assert np.isnan(summarise_record(record)["share_same_as_previous"])  # the first epoch has none before it


@pytest.mark.parametrize("n_rows", [0, 1, 1000, 1025, 5000, 1 << 22, 10**7])
def test_a_mining_block_holds_at_most_4m_distances_and_as_many_queries_as_fit(n_rows):
    """The queries of one exact pass over ``n_rows`` rows: a whole number, at least one, at most SEARCH_BLOCK, and
    the most whose [block, n_rows] distances stay within 2**22 (one query may exceed it: it cannot be split)."""
    block = row_block(n_rows)
    assert isinstance(block, int) and 1 <= block <= SEARCH_BLOCK
    assert block == 1 or block * n_rows <= 1 << 22
    assert block == SEARCH_BLOCK or (block + 1) * n_rows > 1 << 22


def test_a_runs_mining_settings_are_its_config():
    """Mining.of_run takes negatives.n_neighbors, negatives.index and both selection rules (relative_margin,
    rank_range) from the config, and the device from the runtime: a rule it dropped would mine the hardest negatives
    while the run's config says otherwise."""
    import torch

    from biencoder.engine.config.schema import NegativesSchema
    from biencoder.engine.machine.runtime import Runtime

    meta = Runtime(torch.device("meta"), "fp32")  # any device but the CPU, the dataclass's default
    settings = NegativesSchema(n_neighbors=7, index="balltree", relative_margin=0.25, rank_range=[2, 5])
    assert Mining.of_run(settings, meta) == Mining(7, "balltree", torch.device("meta"), 0.25, (2, 5))
    assert Mining.of_run(NegativesSchema(), meta) == Mining(device=torch.device("meta"))
