"""biencoder.engine.retrieval.metrics: every reported rank metric on rankings small enough to count by hand, with
ties, a true counter outside the shortlist, and more queries than a block of 16 (a top-1 was once the mean over
ceil(N/16) queries)."""

import numpy as np
import pytest

from biencoder.engine.retrieval.metrics import (
    NOT_LISTED,
    Ranks,
    by_group,
    epoch_metrics,
    group_top1,
    mrr,
    query_groups,
    recall_at,
    task_metrics,
    top1,
    top1_hits,
)
from biencoder.engine.retrieval.rerank import final_rows, listed_ranks, shortlist_ranks

# five queries, shortlists of k=3 rows in retrieval order (nearest first) and the classifier's margin of each place
ROWS = np.array([[10, 11, 12], [20, 21, 22], [30, 31, 32], [40, 41, 42], [50, 51, 52]])
MARGINS = np.array(
    [
        [0.1, 0.9, 0.5],  # q0: its counter 11, second nearest, has the highest margin → reranked 1, retrieved 2
        [0.7, 0.7, 0.2],  # q1: its counter 20 is nearest; 21 ties its margin and ranks above it → reranked 2
        [0.3, 0.2, 0.1],  # q2: its counter 39 is not in the shortlist → not listed in either order
        [0.5, 0.1, 0.6],  # q3: its counter 41 has the lowest margin → reranked 3, retrieved 2
        [0.1, 0.3, 0.9],  # q4: its counter 52, third nearest, has the highest margin → reranked 1, retrieved 3
    ]
)
TRUE = np.array([11, 20, 39, 41, 52])


def test_the_per_epoch_metrics_of_a_hand_made_shortlist():
    rank, _ = shortlist_ranks(ROWS, MARGINS, TRUE)
    assert rank.tolist() == [1, 2, NOT_LISTED, 3, 1]
    assert listed_ranks(ROWS, TRUE).tolist() == [2, 1, NOT_LISTED, 2, 3]
    reranked, retrieved = Ranks(rank, 3), Ranks(listed_ranks(ROWS, TRUE), 3)
    assert top1_hits(reranked).tolist() == [True, False, False, False, True]
    assert top1_hits(retrieved).tolist() == [False, True, False, False, False]
    final = final_rows(ROWS, MARGINS, TRUE)  # the shortlist is the whole listed ranking here
    assert final.tolist() == [[11, 12, 10], [21, 20, 22], [30, 31, 32], [42, 40, 41], [52, 51, 50]]
    metrics = epoch_metrics(reranked, retrieved, Ranks(listed_ranks(final, TRUE), 100))
    assert metrics == {
        "top1": 2 / 5,  # q2, outside the shortlist, is a miss over 5 queries, not a query left out (2 / 4)
        "retrieval_top1": 1 / 5,
        "recall_at_k": 4 / 5,
        "mrr": (1 + 1 / 2 + 0 + 1 / 3 + 1) / 5,
        "queries": 5,
        "k": 3,
        # the final ranking's places 1, 2, -, 3, 1: one relevant document of grade 1 each
        "ndcg_at_10": (1 + 1 / np.log2(3) + 0 + 1 / np.log2(4) + 1) / 5,
        "mrr_at_10": (1 + 1 / 2 + 0 + 1 / 3 + 1) / 5,
        "recall_at_100": 4 / 5,
    }
    assert list(metrics) == [  # metrics.jsonl's order: today's keys first, as they were
        "top1",
        "retrieval_top1",
        "recall_at_k",
        "mrr",
        "queries",
        "k",
        "ndcg_at_10",
        "mrr_at_10",
        "recall_at_100",
    ]


def test_every_query_counts_in_a_mean_over_more_than_a_block():
    """37 queries, shuffled: a mean over the first of every 16, or of the per-block means, or over the listed
    queries only, gets each of these wrong."""
    rank = np.array([1] * 10 + [2] * 9 + [7] * 3 + [NOT_LISTED] * 15)
    ranks = Ranks(np.random.default_rng(0).permutation(rank), depth=10)
    assert top1(ranks) == pytest.approx(10 / 37, abs=1e-15)
    assert mrr(ranks) == pytest.approx((10 + 9 / 2 + 3 / 7) / 37, abs=1e-15)
    assert recall_at(ranks, 1) == pytest.approx(10 / 37, abs=1e-15)
    assert recall_at(ranks, 6) == pytest.approx(19 / 37, abs=1e-15)
    assert recall_at(ranks, 7) == recall_at(ranks, 10) == pytest.approx(22 / 37, abs=1e-15)  # rank 7 is within 7
    assert epoch_metrics(ranks, ranks, Ranks(ranks.rank, 100))["queries"] == 37


def test_whole_pool_ranks_give_the_tasks_accuracy_and_mrr():
    ranks = Ranks(np.array([1, 3, 2, 1]))  # every rank known (the 8 tasks, the baselines)
    assert task_metrics(ranks) == {"accuracy_at_1": 2 / 4, "mrr": (1 + 1 / 3 + 1 / 2 + 1) / 4}
    assert recall_at(ranks, 2) == 3 / 4 and recall_at(ranks, 3) == 1.0 and recall_at(ranks, 500) == 1.0
    assert task_metrics(Ranks(np.array([], dtype=np.int64))) == {"accuracy_at_1": None, "mrr": None}
    assert recall_at(Ranks(np.array([], dtype=np.int64), 3), 3) is None


def test_ranks_as_lists_and_graded_whole_pool_ranks_with_padding_by_hand():
    """Ranks keeps its ranks and grades as the arrays it checked (lists work as arrays do), and a query of graded
    whole-pool ranks (every place known) may pad its fewer relevant documents: padding is NOT_LISTED, never a place."""
    assert task_metrics(Ranks([1, 3, 2, 1])) == {"accuracy_at_1": 2 / 4, "mrr": (1 + 1 / 3 + 1 / 2 + 1) / 4}
    graded = Ranks([[2, NOT_LISTED], [3, 1]], None, [[1, 0], [1, 2]])  # q0: one relevant document at place 2
    assert graded.rank.tolist() == [[2, NOT_LISTED], [3, 1]] and graded.grade.tolist() == [[1, 0], [1, 2]]
    assert top1_hits(graded).tolist() == [False, True] and mrr(graded) == (1 / 2 + 1) / 2


def test_a_recall_deeper_than_the_ranking_is_refused():
    """A counter at place 7 of a ranking listed to 5 places is NOT_LISTED: its recall@10 would read as a recall@5."""
    ranks = Ranks(np.array([1, NOT_LISTED, 5]), depth=5)
    assert recall_at(ranks, 5) == 2 / 3
    with pytest.raises(ValueError, match="recall@6 of a ranking that lists 5 places"):
        recall_at(ranks, 6)
    with pytest.raises(ValueError, match="recall@0"):
        recall_at(Ranks(np.array([1, 2])), 0)


@pytest.mark.parametrize(
    "rank, depth, problem",
    [
        ([0, 1], None, "from 0 to 1 in a ranking that lists every place"),  # whole-pool ranks are all known
        ([1, 4], 3, "from 1 to 4 in a ranking that lists 3 places"),  # a shortlist of 3 has no place 4
        ([-1, 1], 3, "from -1 to 1"),
        ([[1, 2]], None, "1-D integer array"),
        ([1.0, 2.0], None, "1-D integer array"),
    ],
)
def test_impossible_ranks_are_refused(rank, depth, problem):
    with pytest.raises(ValueError, match=problem):
        Ranks(np.array(rank), depth)


def test_the_top1_of_the_unseen_and_the_seen_queries_by_hand():
    ranks = Ranks(np.array([1, NOT_LISTED, 2, 1, 1]), depth=3)
    seen = np.array([True, True, False, False, False])
    groups = query_groups(seen)
    assert list(groups) == ["unseen", "seen"]
    assert groups["unseen"].tolist() == [False, False, True, True, True] and groups["seen"].tolist() == seen.tolist()
    # a 0/1 column (as a CSV or a DataFrame gives it) makes the same groups, not a negated integer array
    assert {name: mask.tolist() for name, mask in query_groups(seen.astype(int)).items()} == {
        name: mask.tolist() for name, mask in groups.items()
    }
    with_counts = group_top1(ranks, groups, counts=True)
    assert with_counts == {"top1_unseen": 2 / 3, "queries_unseen": 3, "top1_seen": 1 / 2, "queries_seen": 2}
    assert list(with_counts) == ["top1_unseen", "queries_unseen", "top1_seen", "queries_seen"]
    assert group_top1(ranks, groups, "top1_group") == {"top1_group_unseen": 2 / 3, "top1_group_seen": 1 / 2}
    # no seen query: None, never 0 or NaN; the unseen group is every query
    assert group_top1(ranks, query_groups(np.zeros(5, bool)), counts=True) == {
        "top1_unseen": 3 / 5,
        "queries_unseen": 5,
        "top1_seen": None,
        "queries_seen": 0,
    }


def test_a_group_keeps_its_queries_and_the_rankings_depth():
    ranks = Ranks(np.array([3, 1, NOT_LISTED, 2]), depth=3)
    parts = by_group(ranks, {"a": np.array([True, False, True, False]), "b": np.array([False, True, False, True])})
    assert (parts["a"].rank.tolist(), parts["a"].depth) == ([3, NOT_LISTED], 3)
    assert (parts["b"].rank.tolist(), parts["b"].depth) == ([1, 2], 3)
    assert mrr(parts["a"]) == (1 / 3 + 0) / 2 and mrr(parts["b"]) == (1 + 1 / 2) / 2
    # indices of queries, or a mask of other queries (all of them rather than a sample), are not a group of these
    with pytest.raises(ValueError, match=r"\[4\] bool mask"):
        ranks.of(np.array([0, 1, 0, 1]))
    with pytest.raises(ValueError, match=r"\[4\] bool mask"):
        ranks.of(np.ones(5, bool))


def test_the_per_epoch_ranks_must_be_of_one_shortlist():
    ranks = Ranks(np.array([1, 2]), 3)
    for other in (Ranks(np.array([1, 2]), 4), Ranks(np.array([1, 2, 1]), 3)):
        with pytest.raises(ValueError, match="same queries"):
            epoch_metrics(ranks, other, Ranks(np.array([1, 2]), 100))
    with pytest.raises(ValueError, match="same queries"):
        epoch_metrics(Ranks(np.array([1, 2])), Ranks(np.array([1, 2])), Ranks(np.array([1, 2]), 100))  # no k
    with pytest.raises(ValueError, match="listed to 100 places or more"):  # R@100 of a 10-deep ranking: a recall@10
        epoch_metrics(ranks, ranks, Ranks(np.array([1, 2]), 10))
    with pytest.raises(ValueError, match="final ranks must be of the same queries"):  # a query more, deep enough
        epoch_metrics(ranks, ranks, Ranks(np.array([1, 2, 3]), 100))
