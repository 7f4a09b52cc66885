"""Exact search agrees with the BallTree: same neighbours on random data, a planted nearest neighbour, and the
same mined negatives and retrieved candidates. The per-epoch retrieval order (engine/retrieval/order.py) and the rows
ahead of a target (search.ahead): each relevant document's place, counted in the search, is its place in the final
ranking to 100 places (rerank.final_ranking, what test.run.gz lists), with twins, distance ties, graded BEIR queries,
the positives pool and either index; the float32 screen leaves every close call to float64 (under either of torch's
precision settings), and a target with too many rows ahead is beyond."""

import types

import numpy as np
import pytest
import torch

from biencoder.engine.data.beir import read_beir
from biencoder.engine.data.paired import PairedSplit
from biencoder.engine.machine.precision import unit_roundoff
from biencoder.engine.modeling.model import Embeddings
from biencoder.engine.retrieval import search
from biencoder.engine.retrieval.metrics import FINAL_DEPTH, NOT_LISTED, judged_ranks
from biencoder.engine.retrieval.negatives import Mining, mine_negatives
from biencoder.engine.retrieval.order import (
    NONE,
    _searched,
    excluded_rows,
    retrieval_order,
    retrieve,
    retrieve_ranking,
)
from biencoder.engine.retrieval.rerank import Rerank, final_ranking, final_rows, rerank_ranks, shortlist_margins
from biencoder.engine.retrieval.search import BEYOND, Counting, NeighbourIndex, squared_distances
from helpers import beir_folder, paired_split, tied_split


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


@pytest.mark.parametrize("index", ["exact", "balltree"])
def test_k_larger_than_the_data_is_clipped(index):
    d, r = NeighbourIndex(np.eye(3), index).query(np.eye(3), 10)
    assert r.shape == (3, 3) and r[:, 0].tolist() == [0, 1, 2]
    d, r = NeighbourIndex(np.array([[3.0, 4.0]]), index).query(np.array([[0.0, 0.0], [3.0, 4.0]]), 10)  # one row
    assert r.tolist() == [[0], [0]] and d.tolist() == [[5.0], [0.0]]


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
    """A search of zero queries (the Retriever's search of an empty list) answers [0, k] distances and rows, and
    counts of [0, R] ints (the targets' shape)."""
    searched = NeighbourIndex(np.arange(12, dtype=np.float64).reshape(6, 2), index)
    dist, rows = searched.query(np.zeros((0, 2)), 3)
    assert dist.shape == rows.shape == (0, 3) and rows.dtype.kind == "i" and dist.dtype.kind == "f"
    counting = Counting(np.zeros((0, 2), dtype=np.int64), np.zeros((0, 1), dtype=np.int64), 5)
    counted = searched.query_ahead(np.zeros((0, 2)), 3, counting)[2]
    assert counted.shape == (0, 2) and counted.dtype == np.int64


def both_ways(model, emb, split, rerank):
    """(the places rerank_ranks counts, the places of the relevant documents in final_ranking's 100), [P, R] each."""
    counted = rerank_ranks(model, emb, split, rerank).final
    relevant, grade = split.judgements()
    ranking = final_ranking(model, emb, split, rerank)
    listed = judged_ranks(ranking, relevant, grade, max(rerank.k, FINAL_DEPTH))
    assert counted.depth == listed.depth and np.array_equal(counted.grade, listed.grade)
    return counted.rank, listed.rank


def brute_places(model, emb, split, rerank):
    """[P, R] each relevant document's place: in the per-epoch search's first max(k, 10) places, reranked
    (final_rows), where it is there; else one plus the candidates of its query that every float64 distance puts ahead
    of it (nearer, or as near and a lower row); NOT_LISTED past 100."""
    relevant, grade = split.judgements()
    space = emb.retrieval(rerank.space).double()
    d = squared_distances(space[None, split.pool_rows, :], space[split.query][:, None, :]).numpy()  # [P, pool]
    rows = split.pool_rows
    order = retrieval_order(space.numpy(), split, rerank.k, rerank.index)
    short = order.rows[:, : min(rerank.k, len(rows) - split.search_extra())]
    [margins] = shortlist_margins(model, emb, split.query, [short])
    first = final_rows(order.rows, margins, split.counter)
    places = judged_ranks(first, relevant, grade, FINAL_DEPTH).rank
    for q, r in zip(*np.nonzero((places == NOT_LISTED) & (grade > 0)), strict=True):
        t = np.searchsorted(rows, relevant[q, r])
        ahead = (d[q] < d[q, t]) | ((d[q] == d[q, t]) & (rows < rows[t]))
        place = 1 + (ahead & split.is_candidate(rows[None, :], np.array([q]))[0]).sum()
        places[q, r] = place if place <= FINAL_DEPTH else NOT_LISTED
    return places


@pytest.mark.parametrize("index", ["exact", "balltree"])
@pytest.mark.parametrize("k", [3, 10, 40])
def test_counted_places_among_ties_and_twins(tiny_model_and_tokenizer, index, k):
    """150 pairs whose sim vectors are small integers (distance ties everywhere) and whose counters have twins: each
    place is the one every float64 distance gives, past the shortlist, past the first 10 and past 100 (not listed)."""
    split, emb = tied_split(150, seed=1)
    model, rerank = tiny_model_and_tokenizer[0], Rerank(k=k, index=index)
    places = rerank_ranks(model, emb, split, rerank).final.rank
    np.testing.assert_array_equal(places, brute_places(model, emb, split, rerank))
    places = places[:, 0]
    assert (places > max(k, 10)).any() and (places == NOT_LISTED).any()


def continuous(split, rng):
    """Sim vectors of 3 normal coordinates per text (equal texts, equal vectors: the only distance ties)."""
    ids = split.text_id
    sim = torch.zeros(len(ids), 128)
    sim[:, :3] = torch.from_numpy(rng.normal(size=(ids.max() + 1, 3))[ids]).float()
    pooled = torch.from_numpy(rng.normal(size=(ids.max() + 1, 32))[ids]).float()
    return Embeddings(sim, pooled)


@pytest.mark.parametrize("pool", ["all", "positives"])
def test_counted_places_are_the_places_test_run_lists(tiny_model_and_tokenizer, pool):
    """Where only twins tie, the counted places are the relevant documents' places in final_ranking's 100 (the
    ranking test.run.gz lists), so that trec_eval reads the run's own figures from it."""
    split, _ = tied_split(150, seed=2)
    split = PairedSplit(split.name, split.table, pool=pool)
    counted, listed = both_ways(
        tiny_model_and_tokenizer[0], continuous(split, np.random.default_rng(5)), split, Rerank(k=5)
    )
    np.testing.assert_array_equal(counted, listed)
    assert (counted[:, 0] > 10).any() and (counted[:, 0] == NOT_LISTED).any()


def graded_beir(folder, rng):
    """A BEIR folder of 160 documents (some texts repeated, one query's text among them) and 30 test queries with 1
    to 4 relevant documents each, graded 1 to 3."""
    texts = [f"doc {i % 120}" for i in range(160)]
    docs = [{"_id": f"d{i}", "title": "", "text": t} for i, t in enumerate(texts)]
    queries = [{"_id": f"q{i}", "text": "doc 7" if i == 0 else f"query {i}"} for i in range(30)]
    lines = []
    for q in range(30):
        for d in rng.choice(160, size=rng.integers(1, 5), replace=False):
            lines.append(f"q{q}\td{d}\t{rng.integers(1, 4)}")
    return beir_folder(folder, docs, queries, {"test.tsv": lines})


@pytest.mark.parametrize("index", ["exact", "balltree"])
def test_counted_places_of_graded_documents(tiny_model_and_tokenizer, tmp_path, index):
    """Several relevant documents per query: each one's place is counted, the other relevant documents ahead of it
    included (they are in the final ranking)."""
    rng = np.random.default_rng(3)
    split = read_beir(graded_beir(tmp_path / "b", rng)).paired("test", "all")
    emb, model, rerank = continuous(split, rng), tiny_model_and_tokenizer[0], Rerank(k=4, index=index)
    counted, listed = both_ways(model, emb, split, rerank)
    np.testing.assert_array_equal(counted, listed)
    np.testing.assert_array_equal(counted, brute_places(model, emb, split, rerank))
    assert split.judgements()[0].shape[1] > 1 and (counted > 10).any() and (counted == NOT_LISTED).any()


def test_the_ranks_of_some_queries_are_the_whole_splits(tiny_model_and_tokenizer, tmp_path):
    """``pairs`` (eval.sample's queries), out of order: each query's ranks are the ones the whole split gives it,
    the places counted past the first 10 included."""
    rng = np.random.default_rng(3)
    split = read_beir(graded_beir(tmp_path / "b", rng)).paired("test", "all")
    emb, model, rerank = continuous(split, rng), tiny_model_and_tokenizer[0], Rerank(k=4)
    whole, pairs = rerank_ranks(model, emb, split, rerank), np.arange(split.n_pairs)[::-3]
    some = rerank_ranks(model, emb, split, rerank, pairs)
    for part in ("reranked", "retrieved", "final"):
        np.testing.assert_array_equal(getattr(some, part).rank, getattr(whole, part).rank[pairs])
    assert (some.final.rank > 10).any()


def test_the_order_keeps_the_first_places_of_the_ranking():
    split, _ = tied_split(60)
    sim = continuous(split, np.random.default_rng(6)).sim.numpy()
    order = retrieval_order(sim, split, 3, "exact")
    assert order.rows.shape[1] == 10  # max(k, 10): nDCG@10 reads ten places
    np.testing.assert_array_equal(order.rows, retrieve_ranking(sim, split, 100, "exact")[:, :10])
    assert retrieval_order(sim, split, 12, "exact").rows.shape[1] == 12


@pytest.mark.parametrize("pool", ["all", "positives"])
def test_the_order_of_a_pool_smaller_than_its_places_lists_every_candidate(pool):
    """5 pairs: a pool of 10 rows (``all``: 9 candidates at most, the query is never one) or 5 (``positives``), less
    than the 10 places of the order. Each query's order lists all its candidates, and its width is the most any query
    has: no place beyond them, none of them cut."""
    split, _ = tied_split(5)
    split = PairedSplit(split.name, split.table, pool=pool)
    sim = continuous(split, np.random.default_rng(4)).sim.numpy()
    order = retrieval_order(sim, split, 3, "exact")
    rows = split.pool_rows
    candidates = split.is_candidate(np.broadcast_to(rows, (split.n_pairs, len(rows))))
    assert order.rows.shape[1] == candidates.sum(axis=1).max() == len(rows) - (pool == "all")
    for q in range(split.n_pairs):
        assert sorted(r for r in order.rows[q].tolist() if r != NONE) == rows[candidates[q]].tolist()


def test_the_places_of_rows_in_the_searched_pool_by_hand():
    """``_searched``: a row's place in the ascending pool the index holds (-1 kept); a row the pool does not hold
    (between its rows, past its end, in an empty pool) is a ValueError, never a neighbour's place."""
    pool = np.array([3, 5, 8])
    assert _searched(pool, np.array([[8, 3, -1], [5, -1, -1]])).tolist() == [[2, 0, -1], [1, -1, -1]]
    assert _searched(np.array([5]), np.array([[5, -1]])).tolist() == [[0, -1]]
    for held, rows in ((pool, [[4]]), (pool, [[3, 9]]), (np.array([5]), [[7]]), (np.array([], dtype=np.int64), [[2]])):
        with pytest.raises(ValueError, match="does not search"):
            _searched(held, np.array(rows))


def test_a_place_of_100_is_listed_and_101_is_not():
    """120 pairs of distinct texts on a line, row r at r: query 0's counter at 99.5 has rows 1-99 nearer, place
    100 (the last that recall@100 lists); at 100.5, rows 1-100, place 101, not listed. The query itself (row 0, at
    distance 0) is nearer still but never a candidate: the count sets it aside."""
    q = 120
    split = paired_split([f"p{i}" for i in range(q)], [f"c{i}" for i in range(q)])
    sim = np.zeros((2 * q, 3))
    sim[:, 0] = np.arange(2 * q)
    for at, place in ((99.5, 100), (100.5, NOT_LISTED), (98.5, 99)):
        sim[q, 0] = at
        assert retrieval_order(sim, split, 3, "exact", pairs=np.array([0])).places.tolist() == [[place]], at


def test_the_rows_a_querys_places_set_aside_by_hand():
    """``excluded_rows``: rows p0 p1 p2 c0 c1 c2 with texts t u w t v t. Query 0 sets aside itself and c2, the
    twin of its counter, each once (p0 has both the query's text and the counter's); query 1 itself; query 2 itself
    and c0, the twin of its counter (p0, a point of that text, is a candidate). Any sample of the queries gets its
    own rows; no queries, none."""
    split = paired_split(["t", "u", "w"], ["t", "v", "t"])
    assert excluded_rows(split, np.arange(3)).tolist() == [[5, 0], [1, -1], [3, 2]]
    assert excluded_rows(split, np.array([1])).tolist() == [[1]]
    assert excluded_rows(split, np.array([0])).tolist() == [[5, 0]]  # row 0 too: a sample (or block) of query 0
    assert excluded_rows(split, np.array([], dtype=np.int64)).shape == (0, 1)
    order = retrieval_order(np.zeros((6, 3)), split, 3, "exact", pairs=np.array([], dtype=np.int64))
    assert order.rows.shape == (0, 5) and order.places.shape == (0, 1)  # 5: the pool less the query


def brute_ahead(data, queries, targets, ignore=None):
    """[Q, R] how many rows every float64 distance (the search's formula) puts ahead of each target (-1: 0), not
    counting ``ignore`` [Q, E] (-1: none)."""
    d = squared_distances(torch.as_tensor(data)[None, :, :], torch.as_tensor(queries)[:, None, :]).numpy()
    rows = np.arange(len(data))
    out = np.zeros(targets.shape, dtype=np.int64)
    for q, row in enumerate(targets):
        skip = set() if ignore is None else set(ignore[q].tolist())
        for slot, t in enumerate(row):
            if t >= 0:
                ahead = np.nonzero((d[q] < d[q, t]) | ((d[q] == d[q, t]) & (rows < t)))[0]
                out[q, slot] = len(set(ahead.tolist()) - skip)
    return out


def test_rows_ahead_by_hand():
    """Points on a line at 0, 1, 1, 2, 3 (rows 0-4), the query at 0.9: distances 0.9, 0.1, 0.1, 1.1, 2.1. Ahead of
    row 2 (tied with row 1, a lower row): 1 row; of row 0: rows 1 and 2; of row 4: all four others; row 3's slot is
    empty (-1: 0). Ignoring rows 1, 3 and 2 (row 2 is the first target itself, never counted for it): 0, 0 and 1."""
    data = np.array([[0.0], [1.0], [1.0], [2.0], [3.0]])
    tree, query, targets = NeighbourIndex(data, "exact"), np.array([[0.9]]), np.array([[2, 0, 4, -1]])
    none = np.array([[-1]])
    assert tree.query_ahead(query, 2, Counting(targets, none, 10))[2].tolist() == [[1, 2, 4, 0]]
    assert tree.query_ahead(query, 2, Counting(targets, np.array([[1, 3, 2, -1]]), 10))[2].tolist() == [[0, 0, 1, 0]]
    assert NeighbourIndex(data, "balltree").query_ahead(query, 2, Counting(targets, none, 10))[2].tolist() == [
        [1, 2, 4, 0]
    ]
    # at most 2 counted: row 4's four are BEYOND, whatever is ignored
    assert tree.query_ahead(query, 2, Counting(targets, np.array([[1, 3]]), 2))[2].tolist() == [[0, 1, BEYOND, 0]]


@pytest.mark.parametrize("scan_rows", [16384, 0])  # every row compared; a top-k first (search.SCAN_ROWS)
@pytest.mark.parametrize("index", ["exact", "balltree"])
def test_rows_float32_cannot_order_are_ordered_in_float64(index, scan_rows, monkeypatch):
    """Rows 1e-9 apart around a point 1e3 from the origin: float32 cannot tell them apart (its step there is 6e-5),
    so every order among them is float64's; the counts equal those of every float64 distance, in blocks of 7, ignored
    rows (some of them twins of a target) left out."""
    monkeypatch.setattr(search, "SCAN_ROWS", scan_rows)
    rng = np.random.default_rng(4)
    base = rng.normal(size=(1, 6)) * 1e3
    data = np.concatenate([base + rng.normal(size=(200, 6)) * 1e-9, rng.normal(size=(100, 6)) * 1e3])
    data[250:260] = data[0:10]  # exact twins: ties broken by the lower row
    queries = base + rng.normal(size=(40, 6)) * 1e-8
    targets, ignore = rng.integers(-1, 300, size=(40, 3)), rng.integers(-1, 300, size=(40, 4))
    tree = NeighbourIndex(data, index, block=7)
    counted = tree.query_ahead(queries, 5, Counting(targets, ignore, 1000))[2]
    np.testing.assert_array_equal(counted, brute_ahead(data, queries, targets, ignore))
    assert (counted > 20).any()
    # counted to 30: the same counts up to 30 of all rows ahead, BEYOND past them
    capped = tree.query_ahead(queries, 5, Counting(targets, ignore, 30))[2]
    every = brute_ahead(data, queries, targets)
    np.testing.assert_array_equal(capped, np.where(every > 30, BEYOND, counted))
    assert (capped == BEYOND).any() and ((capped > 0) & (capped < 30)).any()
    # and the neighbours listed are the float64 order's, though float32 ties them across its shortlist's edge
    d = squared_distances(torch.as_tensor(data)[None, :, :], torch.as_tensor(queries)[:, None, :]).numpy()
    np.testing.assert_array_equal(
        tree.query(queries, 5)[1], np.lexsort((np.arange(300)[None, :].repeat(40, 0), d))[:, :5]
    )
    np.testing.assert_array_equal(tree.query_ahead(queries, 5)[1], tree.query(queries, 5)[1])


@pytest.mark.parametrize("scan_rows", [0, 16384])
@pytest.mark.parametrize("index", ["exact", "balltree"])
def test_a_count_up_to_its_limit_is_exact(index, scan_rows, monkeypatch):
    """200 rows on a line, row r at r, queries at -0.5 and -100.5: row r has r rows ahead of both. Counted to 40,
    past the search's first rows, by one top-k over the rows (``SCAN_ROWS`` 0: each query's own edge) or a scan of
    every row: 40 rows ahead is 40, 41 is BEYOND."""
    monkeypatch.setattr(search, "SCAN_ROWS", scan_rows)
    data = np.zeros((200, 3))
    data[:, 0] = np.arange(200)
    queries = np.array([[-0.5, 0.0, 0.0], [-100.5, 0.0, 0.0]])
    counting = Counting(np.array([[40, 41, 39, 100], [39, 40, 41, 0]]), np.array([[-1], [-1]]), 40)
    counted = NeighbourIndex(data, index).query_ahead(queries, 1, counting)[2]
    assert counted.tolist() == [[40, BEYOND, 39, BEYOND], [39, 40, BEYOND, 0]]


def test_a_collapsed_space_is_ordered_by_row():
    """Every vector equal (a collapsed sim head): all distances tie, so the rows ahead of a target are the lower
    rows, each compared in float64."""
    data = np.ones((50, 4))
    targets = np.array([[0], [17], [49]])
    counted = NeighbourIndex(data, "exact").query_ahead(
        np.ones((3, 4)), 5, Counting(targets, np.full((3, 1), -1), 60)
    )[2]
    assert counted.tolist() == [[0], [17], [49]]


def test_a_shortlist_that_float32_cannot_fill_is_ordered_from_every_row():
    """Two clear nearest rows, then 40 rows float32 cannot tell apart (10 + 5e-12·i from the query: all 10.0), the
    nearest in float64 row 0. The float32 shortlist takes some of the 40; whether a row outside it may be as near is
    asked of the k-th place's row (its float32 bound reaches the shortlist's edge), not the (k-1)-th's (a clear row,
    whose bound is far below), so the third place is row 0."""
    cluster = np.stack([10.0 + 5e-12 * np.arange(40), np.zeros(40)], 1)
    data = np.concatenate([cluster, [[1.0, 0.0], [2.0, 0.0]]])
    assert NeighbourIndex(data, "exact").query(np.zeros((1, 2)), 3)[1].tolist() == [[40, 41, 0]]


def test_a_tie_across_the_balltrees_edge_is_ordered_from_every_row():
    """Two clear nearest rows, then 36 rows at distance 5 exactly (the 12 integer points of that circle, three times
    each; 200 more rows at 8 to 30): the BallTree returns 19 (k + 16), some of the tied rows, which of them as its
    traversal finds them. Whether a row it left out ties is asked of the k-th place's distance (5, the edge's), not
    the (k-1)-th's (2), so the third place is the lowest row of the tie, as exact search has it."""
    rng = np.random.default_rng(0)
    circle = [(5, 0), (-5, 0), (0, 5), (0, -5), (3, 4), (3, -4), (-3, 4), (-3, -4), (4, 3), (4, -3), (-4, 3), (-4, -3)]
    far = rng.normal(size=(200, 2))
    far *= rng.uniform(8, 30, size=(200, 1)) / np.linalg.norm(far, axis=1, keepdims=True)
    data = np.concatenate([far, np.tile(np.array(circle, float), (3, 1)), [[1.0, 0.0], [2.0, 0.0]]])
    data = data[rng.permutation(len(data))]
    by_distance_then_row = np.lexsort((np.arange(len(data)), (data**2).sum(1)))[:3]
    for index in ("balltree", "exact"):
        assert NeighbourIndex(data, index).query(np.zeros((1, 2)), 3)[1].tolist() == [by_distance_then_row.tolist()]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_the_screen_allows_for_the_rounding_of_a_long_query(dtype):
    """Queries of norm ~1.4e4 against rows of norm ~14 within 1e-6 of each other: rounding a query's coordinates to
    float32 (half an ulp, ~5e-4) moves a row's screen value by up to ~1e-2, well past the gaps between the rows'
    float64 distances. The screen's slack must cover it by its 2 |q| max |x| term (``/ |q|`` or ``/ max |x|`` there
    would not), or it counts rows ahead that are not; every count is the float64 one. Float32 queries (an encoder's)
    are read as float64: their ||q||² in float32 would move the target's value by ~10, past the slack."""
    rng = np.random.default_rng(11)
    queries = (np.array([1e4, 1e4]) + rng.uniform(-1e-3, 1e-3, size=(20, 2))).astype(dtype)
    data = np.array([10.0, -10.0]) + rng.normal(size=(400, 2)) * 1e-6
    targets = rng.integers(0, 400, size=(20, 3))
    counted = NeighbourIndex(data, "exact").query_ahead(queries, 1, Counting(targets, np.full((20, 1), -1), 500))[2]
    np.testing.assert_array_equal(counted, brute_ahead(data, queries, targets))


@pytest.mark.parametrize(
    "lower",
    [
        lambda: torch.set_float32_matmul_precision("medium"),
        lambda: setattr(torch.backends.mkldnn.matmul, "fp32_precision", "bf16"),  # torch >= 2.9's own setting
    ],
    ids=["set_float32_matmul_precision", "mkldnn.matmul.fp32_precision"],
)
def test_a_lower_matmul_precision_widens_the_screen(torch_precision, lower):
    """With torch's float32 products on a CPU allowed to run in bfloat16, by either of torch's settings, the screen
    assumes bfloat16's rounding, and the counts are still every float64 distance's."""
    rng = np.random.default_rng(7)
    data = rng.normal(size=(400, 16)) * 30
    queries, targets = data[:25] + rng.normal(size=(25, 16)) * 1e-3, rng.integers(0, 400, size=(25, 2))
    lower()
    assert unit_roundoff(torch.device("cpu")) == 2.0**-8
    counted = NeighbourIndex(data, "exact").query_ahead(queries, 3, Counting(targets, np.full((25, 1), -1), 500))[2]
    np.testing.assert_array_equal(counted, brute_ahead(data, queries, targets))


# -- the screen's unit roundoff under torch's two precision settings: set_float32_matmul_precision (allow_tf32 is its
# "high") and, since torch 2.9, each backend's matmul fp32_precision, under which torch refuses to read the first. The
# device is only named, so a CPU runs the CUDA cases.
CPU, CUDA = torch.device("cpu"), torch.device("cuda")
needs_per_backend = pytest.mark.skipif(
    not hasattr(torch.backends.cuda.matmul, "fp32_precision"), reason="torch < 2.9 has no per-backend fp32_precision"
)


@pytest.mark.parametrize(("precision", "expected"), [("highest", 2.0**-24), ("high", 2.0**-11), ("medium", 2.0**-8)])
def test_the_float32_matmul_precision_on_either_device(torch_precision, precision, expected):
    """ "high" is TF32's (or bfloat16x3's, finer); "medium" bfloat16's on either device, although torch reports it to
    the CUDA backend as "tf32": the coarser of the two readings counts."""
    torch.set_float32_matmul_precision(precision)
    assert unit_roundoff(CPU) == unit_roundoff(CUDA) == expected


def test_allow_tf32_is_tf32s_on_either_device(torch_precision):
    torch.backends.cuda.matmul.allow_tf32 = True
    assert unit_roundoff(CUDA) == unit_roundoff(CPU) == 2.0**-11
    torch.backends.cuda.matmul.allow_tf32 = False
    assert unit_roundoff(CUDA) == unit_roundoff(CPU) == 2.0**-24


def test_a_torch_without_per_backend_settings_reads_the_older_one(torch_precision, monkeypatch):
    """Before torch 2.9 the backends have no ``fp32_precision`` and mkldnn no ``matmul``: the older setting alone
    decides, on either device (torch's modules stood in for by ones without those attributes)."""
    torch.set_float32_matmul_precision("high")
    monkeypatch.setattr(torch.backends, "mkldnn", types.SimpleNamespace())
    monkeypatch.setattr(torch.backends.cuda, "matmul", types.SimpleNamespace(allow_tf32=True))
    assert unit_roundoff(CPU) == unit_roundoff(CUDA) == 2.0**-11


@needs_per_backend
def test_a_cuda_matmul_in_tf32_is_the_gpus_alone(torch_precision):
    """The setting torch's warnings recommend: the older getter then raises, which must not reach the search."""
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    with pytest.raises(RuntimeError):
        torch.get_float32_matmul_precision()
    assert unit_roundoff(CUDA) == 2.0**-11
    assert unit_roundoff(CPU) == 2.0**-24


@needs_per_backend
def test_a_cpu_matmul_in_bfloat16_is_the_cpus_alone(torch_precision):
    torch.backends.mkldnn.matmul.fp32_precision = "bf16"
    assert unit_roundoff(CPU) == 2.0**-8
    assert unit_roundoff(CUDA) == 2.0**-24


@needs_per_backend
def test_the_backends_inherit_the_generic_setting(torch_precision):
    """``torch.backends.fp32_precision``: a backend at "none" takes it where it can compute in it (CUDA has no
    bfloat16 matmul setting, so it stays float32)."""
    torch.backends.cuda.matmul.fp32_precision = torch.backends.mkldnn.matmul.fp32_precision = "none"
    torch.backends.fp32_precision = "tf32"
    assert unit_roundoff(CUDA) == unit_roundoff(CPU) == 2.0**-11
    torch.backends.fp32_precision = "bf16"
    assert unit_roundoff(CPU) == 2.0**-8
    assert unit_roundoff(CUDA) == 2.0**-24


@pytest.mark.parametrize("pool", ["all", "positives"])
def test_the_excluded_rows_are_the_pools_non_candidates(tmp_path, pool):
    """excluded_rows (what the counted places leave out) are, per query, exactly the pool's rows is_candidate
    rejects: on a split of twins and shared texts, and on graded BEIR queries (own documents, twins of relevant
    documents)."""
    split, _ = tied_split(150, seed=3)
    splits = [PairedSplit(split.name, split.table, pool=pool)]
    splits.append(read_beir(graded_beir(tmp_path / "b", np.random.default_rng(8))).paired("test", pool))
    for split in splits:
        pairs = np.arange(split.n_pairs)
        rows = np.broadcast_to(split.pool_rows, (len(pairs), len(split.pool_rows)))
        rejected = ~split.is_candidate(rows, pairs)
        got = excluded_rows(split, pairs)
        for q in pairs:
            assert sorted(r for r in got[q].tolist() if r >= 0) == rows[q][rejected[q]].tolist(), q
        assert (got >= 0).any()


@pytest.mark.parametrize("index", ["exact", "balltree"])
def test_a_collapsed_beir_space_lists_and_counts_by_row(tiny_model_and_tokenizer, tmp_path, index):
    """Every vector equal (a collapsed sim head) and several relevant documents per query: every distance ties, so
    the order is by row, both in the first places the search lists and in the places it counts past them; no relevant
    document is listed at a place another is counted at."""
    split = read_beir(graded_beir(tmp_path / "b", np.random.default_rng(9))).paired("test", "all")
    emb = Embeddings(torch.ones(len(split.table), 128), torch.ones(len(split.table), 32))
    model, rerank = tiny_model_and_tokenizer[0], Rerank(k=4, index=index)
    order = retrieval_order(emb.sim.numpy(), split, 4, index)
    candidates = split.is_candidate(np.broadcast_to(split.pool_rows, (split.n_pairs, len(split.pool_rows))))
    first = [split.pool_rows[c][:10].tolist() for c in candidates]
    assert order.rows.tolist() == first
    np.testing.assert_array_equal(
        rerank_ranks(model, emb, split, rerank).final.rank, brute_places(model, emb, split, rerank)
    )
