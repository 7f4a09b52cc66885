"""Exact search agrees with the BallTree: same neighbours on random data, a planted nearest neighbour, and the
same mined negatives and retrieved candidates."""

import numpy as np
import pytest

from biencoder.engine.retrieval.negatives import Mining, mine_negatives
from biencoder.engine.retrieval.rerank import retrieve
from biencoder.engine.retrieval.search import NeighbourIndex


@pytest.mark.parametrize("kind", ["balltree", "exact"])
def test_planted_nearest_neighbour(kind):
    rng = np.random.default_rng(0)
    data = rng.normal(size=(300, 16))
    queries = data[[7, 42, 299]] + 1e-3
    dist, rows = NeighbourIndex(data, kind).query(queries, 3)
    assert rows[:, 0].tolist() == [7, 42, 299]
    np.testing.assert_allclose(dist[:, 0], np.full(3, 1e-3 * 4), rtol=1e-6)  # ||(1e-3,)*16|| = 4e-3


def test_exact_equals_balltree_on_random_data():
    rng = np.random.default_rng(1)
    data, queries = rng.normal(size=(2000, 32)), rng.normal(size=(500, 32))
    d_tree, r_tree = NeighbourIndex(data, "balltree").query(queries, 10)
    d_exact, r_exact = NeighbourIndex(data, "exact", block=128).query(queries, 10)  # several blocks
    np.testing.assert_array_equal(r_exact, r_tree)
    np.testing.assert_allclose(d_exact, d_tree, rtol=1e-9)


def test_k_larger_than_the_data_is_clipped():
    d, r = NeighbourIndex(np.eye(3), "exact").query(np.eye(3), 10)
    assert r.shape == (3, 3) and r[:, 0].tolist() == [0, 1, 2]


def test_mining_and_retrieval_agree_across_indexes(demo_corpus):
    split = demo_corpus.paired("train")
    sim = np.random.default_rng(2).normal(size=(len(split.texts), 8))
    mined = [
        mine_negatives(sim, split, 0.3, np.random.default_rng(5), Mining(index=kind)) for kind in ("balltree", "exact")
    ]
    np.testing.assert_array_equal(mined[0].row, mined[1].row)
    np.testing.assert_array_equal(mined[0].is_random, mined[1].is_random)
    got = [retrieve(sim, split, 5, index=kind)[0] for kind in ("balltree", "exact")]
    np.testing.assert_array_equal(got[0], got[1])


def test_the_float64_refinement_is_the_same_in_any_number_of_parts():
    """Exact search re-ranks each block's shortlists in parts of ``refine`` queries (32 on a CPU, for the cache): any
    split, uneven ones included, gives the same distances and rows to the bit, duplicate rows (exact ties) too."""
    rng = np.random.default_rng(3)
    data = rng.normal(size=(700, 24))
    data[350:] = data[:350]  # every row has a twin: ties everywhere, broken lower row first
    queries = data[rng.permutation(700)[:300]] + rng.normal(scale=1e-2, size=(300, 24))
    d_one, r_one = NeighbourIndex(data, "exact", block=128, refine=128).query(queries, 7)
    for refine in (1, 7, 32):
        d, r = NeighbourIndex(data, "exact", block=128, refine=refine).query(queries, 7)
        np.testing.assert_array_equal(r, r_one)
        np.testing.assert_array_equal(d, d_one)
    assert (r_one[:, 1] - r_one[:, 0] == 350).all()  # each twin pair together, the lower row first
    assert NeighbourIndex(data, "exact").refine == 32 and NeighbourIndex(data, "exact", block=64).refine == 32


@pytest.mark.parametrize("index", ["exact", "balltree"])
def test_no_queries_give_empty_answers_of_k_columns(index):
    """A search of zero queries (the Retriever's search of an empty list) answers [0, k] distances and rows."""
    data = np.arange(12, dtype=np.float64).reshape(6, 2)
    dist, rows = NeighbourIndex(data, index).query(np.zeros((0, 2)), 3)
    assert dist.shape == rows.shape == (0, 3) and rows.dtype.kind == "i" and dist.dtype.kind == "f"
