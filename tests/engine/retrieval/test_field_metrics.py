"""The field's metrics (biencoder.engine.retrieval.metrics: ndcg_at, mrr_at, recall_at) on rankings small enough to
count by hand: one true counter per query, graded relevance with several relevant documents, a relevant document the
ranking does not list, and ties (settled by the final ranking, rerank.final_rows, before any metric reads a place).
Each figure below is trec_eval's (ndcg_cut.10, recip_rank of the first 10, recall.100); each test says which plausible
wrong implementation it would catch."""

import math

import numpy as np
import pytest

from biencoder.engine.retrieval.metrics import (
    NOT_LISTED,
    Ranks,
    judged_ranks,
    mrr,
    mrr_at,
    ndcg_at,
    recall_at,
    top1,
    top1_hits,
)
from biencoder.engine.retrieval.order import NONE
from biencoder.engine.retrieval.rerank import final_rows, listed_ranks

L2 = math.log2


def test_one_true_counter_per_query_by_hand():
    """Places 1, 3, 11, not listed (four queries, one relevant document of grade 1 each)."""
    ranks = Ranks(np.array([1, 3, 11, NOT_LISTED]), depth=100)
    # nDCG@10: 1 / log2(1 + place) inside the first 10 (the ideal DCG of one document is 1 / log2(2) = 1)
    assert ndcg_at(ranks, 10) == pytest.approx((1 + 1 / L2(4) + 0 + 0) / 4, abs=1e-15)
    assert ndcg_at(ranks, 10) == pytest.approx(1.5 / 4, abs=1e-15)  # 1/log2(4) = 0.5 exactly
    # MRR@10: place 11 counts 0, not 1/11 (an MRR of the whole listed ranking would say 1/11)
    assert mrr_at(ranks, 10) == pytest.approx((1 + 1 / 3) / 4, abs=1e-15)
    assert mrr(ranks) == pytest.approx((1 + 1 / 3 + 1 / 11) / 4, abs=1e-15)
    # recall@100: three of four are in the first 100; the not-listed one is a miss over 4 queries, not left out
    assert recall_at(ranks, 100) == 3 / 4
    assert recall_at(ranks, 10) == 2 / 4
    # a query with nothing in the first n counts exactly 0, not 1 / (a sentinel place): beside a place of 3000, whose
    # 1/3000 has a resolution of 6e-20, a 1e-19 for the other query would show
    far = Ranks(np.array([3000, NOT_LISTED]), depth=3000)
    assert mrr_at(far, 3000) == (1 / 3000) / 2


def test_the_discount_is_log2_of_one_plus_the_place():
    """Place 2 is discounted by log2(3), place 1 not at all: the variant that discounts place i by log2(i) from place
    2 on (so places 1 and 2 count the same), or by ln(1 + i) without the ideal's same base, gives other numbers."""
    assert ndcg_at(Ranks(np.array([2]), 10), 10) == pytest.approx(1 / L2(3), abs=1e-15)  # 0.6309..., not 1.0
    assert ndcg_at(Ranks(np.array([2]), 10), 10) != pytest.approx(1 / math.log(3))  # not an unnormalised ln
    assert ndcg_at(Ranks(np.array([10]), 10), 10) == pytest.approx(1 / L2(11), abs=1e-15)
    assert ndcg_at(Ranks(np.array([1]), 10), 10) == 1.0


def graded() -> Ranks:
    """Two queries. q0: relevant documents of grades 2, 1, 1 at places 2, 1 and not listed. q1: grade 3 at place 4,
    grade 1 at place 12, padding (grade 0)."""
    return Ranks(
        np.array([[2, 1, NOT_LISTED], [4, 12, NOT_LISTED]]),
        depth=100,
        grade=np.array([[2, 1, 1], [3, 1, 0]]),
    )


def test_graded_relevance_by_hand():
    ranks = graded()
    # q0: DCG = 1/log2(2) + 2/log2(3); the ideal puts 2, 1, 1 at places 1, 2, 3 (the not-listed one included)
    q0 = (1 + 2 / L2(3)) / (2 + 1 / L2(3) + 1 / L2(4))
    # q1: DCG = 3/log2(5) (place 12 is past 10); ideal 3, 1 at places 1, 2
    q1 = (3 / L2(5)) / (3 + 1 / L2(3))
    assert ndcg_at(ranks, 10) == pytest.approx((q0 + q1) / 2, abs=1e-15)
    assert q0 == pytest.approx(0.722424, abs=1e-6) and q1 == pytest.approx(0.355840, abs=1e-6)
    # the first relevant document: place 1 (q0), place 4 (q1)
    assert mrr_at(ranks, 10) == pytest.approx((1 + 1 / 4) / 2, abs=1e-15)
    # MRR over the whole listed ranking: the same first places (not the mean of every relevant document's 1 / place)
    assert mrr(ranks) == pytest.approx((1 + 1 / 4) / 2, abs=1e-15)
    # recall@100: 2 of q0's 3 (the not-listed one is relevant and missed), 2 of q1's 2 (padding is no document)
    assert recall_at(ranks, 100) == pytest.approx((2 / 3 + 1) / 2, abs=1e-15)
    assert recall_at(ranks, 10) == pytest.approx((2 / 3 + 1 / 2) / 2, abs=1e-15)
    assert top1_hits(ranks).tolist() == [True, False] and top1(ranks) == 0.5


def test_graded_metrics_would_catch_plausible_mistakes():
    """The hand figures differ from what each wrong implementation gives, so the tests above would fail on it."""
    ranks, right = graded(), ndcg_at(graded(), 10)
    # the ideal DCG over the listed relevant documents only (q0's not-listed one left out)
    listed_only = ((1 + 2 / L2(3)) / (2 + 1 / L2(3)) + (3 / L2(5)) / (3 + 1 / L2(3))) / 2
    # an exponential gain 2^grade - 1 (not trec_eval's)
    exponential = ((1 + 3 / L2(3)) / (3 + 1 / L2(3) + 1 / L2(4)) + (7 / L2(5)) / (7 + 1 / L2(3))) / 2
    # the ideal DCG in the ranking's order of grades, not sorted best first
    unsorted = ((1 + 2 / L2(3)) / (1 + 2 / L2(3) + 1 / L2(4)) + (3 / L2(5)) / (3 + 1 / L2(3))) / 2
    for wrong in (listed_only, exponential, unsorted):
        assert abs(right - wrong) > 1e-3
    # recall counting only the listed relevant documents: q0 would be 2/2
    assert abs(recall_at(ranks, 100) - 1.0) > 0.1


def test_the_ideal_dcg_stops_at_the_cut():
    """12 relevant documents at places 1..12: nDCG@10 is 1 (the ideal DCG@10 also holds 10 of them); an ideal over all
    12 would give less than 1. Recall@10 is 10/12."""
    ranks = Ranks(np.arange(1, 13)[None, :], depth=100, grade=np.ones((1, 12), dtype=np.int64))
    assert ndcg_at(ranks, 10) == pytest.approx(1.0, abs=1e-15)
    assert recall_at(ranks, 10) == pytest.approx(10 / 12, abs=1e-15)
    assert mrr_at(ranks, 10) == 1.0


def test_ties_count_against_the_relevant_document_in_the_final_ranking():
    """The final ranking (final_rows): the reranked shortlist (k = 3 here), then the rest in retrieval order. A
    candidate whose margin ties the true counter's comes before it; a true counter outside the shortlist keeps its
    retrieval place after the shortlist."""
    rows = np.array([[5, 6, 7, 8, 9], [5, 6, 7, 8, 9], [5, 6, 7, 8, NONE]])
    margins = np.array([[0.5, 0.5, 0.1], [0.2, 0.9, 0.9], [0.3, 0.2, 0.1]])
    true = np.array([5, 7, 8])
    final = final_rows(rows, margins, true)
    # q0: 6 ties the true counter 5 and goes first; q1: 7 ties 6 and comes after it; q2: 8 is past the shortlist
    assert final.tolist() == [[6, 5, 7, 8, 9], [6, 7, 5, 8, 9], [5, 6, 7, 8, NONE]]
    ranks = Ranks(listed_ranks(final, true), 100)
    assert ranks.rank.tolist() == [2, 2, 4]
    assert ndcg_at(ranks, 10) == pytest.approx((2 / L2(3) + 1 / L2(5)) / 3, abs=1e-15)
    assert mrr_at(ranks, 10) == pytest.approx((1 / 2 + 1 / 2 + 1 / 4) / 3, abs=1e-15)
    # ties broken for it instead (a stable sort by margin alone) would put q0's true counter first
    assert final[0, 0] != true[0]


def test_the_end_of_a_short_pool_stays_after_its_listed_rows():
    """A pool of two candidates in a shortlist of k = 3: the empty place (NONE, margin NaN) stays last, whatever the
    listed margins (here all below 0), and the two listed rows are reranked before it."""
    rows = np.array([[5, 6, NONE]])
    final = final_rows(rows, np.array([[-2.0, -1.0, np.nan]]), np.array([5]))
    assert final.tolist() == [[6, 5, NONE]]


def test_a_cut_past_the_ranking_or_below_one_is_refused():
    ranks = Ranks(np.array([1, NOT_LISTED]), depth=10)
    for metric, name in ((ndcg_at, "nDCG"), (mrr_at, "MRR"), (recall_at, "recall")):
        with pytest.raises(ValueError, match=f"{name}@100 of a ranking that lists 10 places"):
            metric(ranks, 100)
        with pytest.raises(ValueError, match=f"{name}@0"):
            metric(ranks, 0)
    empty = Ranks(np.zeros(0, dtype=np.int64), depth=100)
    assert ndcg_at(empty, 10) is None and mrr_at(empty, 10) is None and recall_at(empty, 100) is None


@pytest.mark.parametrize(
    "rank, grade, problem",
    [
        ([[1, 2]], [[1, 1, 1]], "grades must be integers"),  # shapes differ
        ([[1, 2]], [[1.0, 1.0]], "grades must be integers"),
        ([[1, 2]], [[1, -1]], "grades must be integers"),
        ([[NOT_LISTED, NOT_LISTED]], [[0, 0]], "every query needs a relevant document"),
        ([[1, NOT_LISTED], [NOT_LISTED, NOT_LISTED]], [[1, 0], [0, 0]], "every query needs a relevant document"),
        ([[1, 3]], [[1, 0]], "a place of grade 0 is padding"),
        ([[2, 2]], [[1, 1]], "two relevant documents of a query in one place"),
        ([[1, 4, 4]], [[1, 1, 1]], "two relevant documents of a query in one place"),  # not the first place
        ([[1, 101]], [[1, 1]], "from 1 to 101"),
    ],
)
def test_impossible_graded_ranks_are_refused(rank, grade, problem):
    with pytest.raises(ValueError, match=problem):
        Ranks(np.array(rank), 100, np.array(grade))


def test_padding_never_matches_the_end_of_a_short_ranking():
    """A query with fewer relevant documents than the widest (padding: row -1, grade 0) in a ranking of a pool
    shorter than the depth (NONE = -1 past its end): the padding is no document, so it has no place."""
    ranks = judged_ranks(np.array([[3, 4, NONE]]), np.array([[4, -1]]), np.array([[1, 0]]), 100)
    assert ranks.rank.tolist() == [[2, NOT_LISTED]]


def test_one_counter_as_graded_ranks_gives_the_same_figures():
    """[Q] ranks are the case of one document of grade 1: the same numbers as [Q, 1] ranks with grade 1."""
    rank = np.array([1, 3, 11, NOT_LISTED, 57])
    flat, graded_ = Ranks(rank, 100), Ranks(rank[:, None], 100, np.ones((5, 1), dtype=np.int64))
    for metric, n in ((ndcg_at, 10), (mrr_at, 10), (recall_at, 100), (recall_at, 10)):
        assert metric(flat, n) == metric(graded_, n)
    assert mrr(flat) == mrr(graded_) and top1(flat) == top1(graded_)
    assert graded_.of(np.array([True, False, True, False, True])).rank.tolist() == [[1], [11], [57]]
