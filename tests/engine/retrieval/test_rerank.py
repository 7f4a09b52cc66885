"""biencoder.engine.retrieval.rerank: the one retrieve-then-rerank, checked by hand on a line of 4 pairs, and its two
shortlist finders (the per-epoch NeighbourIndex, the 8 tasks' pools) against each other on the demo corpus."""

import numpy as np
import pytest
import torch

from biencoder.engine.data.beir import read_beir
from biencoder.engine.modeling.encoding import TokenizedTexts, encode
from biencoder.engine.modeling.model import Embeddings
from biencoder.engine.retrieval.metrics import NOT_LISTED
from biencoder.engine.retrieval.official_tasks import candidate_types, evaluate_tasks, task_masks
from biencoder.engine.retrieval.order import NONE, retrieve
from biencoder.engine.retrieval.pools import fixed_pools, pool_ranks, pool_shortlists, query_ranks
from biencoder.engine.retrieval.rerank import (
    NonFiniteMargins,
    Rerank,
    rerank_ranks,
    retrieve_rerank,
    shortlist_margins,
    shortlist_ranks,
)
from biencoder.engine.retrieval.search import distances
from helpers import beir_folder, candidate_scorer, paired_split

#        rows: 0=P0 1=P1  2=P2  3=P3  4=C0 5=C1  6=C2  7=C3 (C3 has C0's text: the true counter of P3, a twin of C0)
POSITION = [0.0, 10.0, 20.0, 30.0, 1.0, 13.0, 20.5, 0.5]
MARGIN = [0.0, 0.0, 0.0, 0.0, 1.0, 3.0, 2.0, 5.0]  # the classifier's margin for any query and this candidate


@pytest.fixture
def line(tiny_model_and_tokenizer):
    """4 pairs on a line (sim[:, 0] = POSITION); the classifier's logit margin for (query, candidate) is the
    candidate's pooled[0] = MARGIN."""
    split = paired_split(["p0", "p1", "p2", "p3"], ["c0", "c1", "c2", "c0"])
    sim, pooled = torch.zeros(8, 128), torch.zeros(8, 32)
    sim[:, 0], pooled[:, 0] = torch.tensor(POSITION), torch.tensor(MARGIN)
    return split, Embeddings(sim, pooled), candidate_scorer(tiny_model_and_tokenizer[0])


def per_epoch_pool(split):
    """[Q, 2Q] the false candidates of the per-epoch pool (= epa): is_candidate without the true counter."""
    mask = split.is_candidate(np.tile(np.arange(len(split.table)), (split.n_pairs, 1)))
    mask[np.arange(split.n_pairs), split.counter] = False
    return mask


def test_per_epoch_rerank_by_hand(line):
    split, emb, model = line
    rows, dist = retrieve(emb.sim.numpy(), split, k=2, index="exact")
    # q0 at 0: C0 (1), P1 (10) — C3 at 0.5 is a twin of its true counter C0 and never a candidate
    # q1 at 10: C1 (3), C0 (9) | q2 at 20: C2 (0.5), C1 (7) | q3 at 30: C2 (9.5), P2 (10); its C3 (29.5) not among 2
    assert rows.tolist() == [[4, 1], [5, 4], [6, 5], [6, 2]]
    assert dist.tolist() == [[1.0, 10.0], [3.0, 9.0], [0.5, 7.0], [9.5, 10.0]]
    metrics, hits = retrieve_rerank(model, emb, split, Rerank(k=2, index="exact"))
    # margins: q0 C0 1 > P1 0 → hit; q1 C1 3 > C0 1 → hit; q2 C2 2 < C1 3 → rank 2; q3 its counter not in the k
    assert hits.tolist() == [True, True, False, False]
    assert metrics == {
        "top1": 0.5,
        "retrieval_top1": 0.75,
        "recall_at_k": 0.75,
        "mrr": (1 + 1 + 1 / 2 + 0) / 4,
        "queries": 4,
        "k": 2,
        # the final ranking: the reranked 2, then by distance; q3's pool C2 P2 | C1 P1 C3 P0 puts C3 at place 5
        "ndcg_at_10": (1 + 1 + 1 / np.log2(3) + 1 / np.log2(6)) / 4,
        "mrr_at_10": (1 + 1 + 1 / 2 + 1 / 5) / 4,
        "recall_at_100": 1.0,
    }


def test_pool_ranks_by_hand(line):
    """The epa pool: the k reranked first, the rest of the pool after them by distance (ties count against)."""
    split, emb, model = line
    ranks = pool_ranks(model, emb, split, fixed_pools({"all": per_epoch_pool(split)}), Rerank(k=2, batch_size=4096))[
        "all"
    ]
    # q3: the k (C2, P2), then C1 (17) and P1 (20) are nearer than its counter C3 (29.5) → rank 2 + 2 + 1
    assert ranks.tolist() == [1, 1, 2, 5]
    metrics, hits = retrieve_rerank(model, emb, split, Rerank(k=2))
    assert (ranks == 1).tolist() == hits.tolist()  # the per-epoch top-1 is the epa pool's
    # P0 moved to 0.5 ties C3 for q3 (both 29.5 away): a tie counts against the true counter
    emb.sim[0, 0] = 0.5
    assert (
        pool_ranks(model, emb, split, fixed_pools({"all": per_epoch_pool(split)}), Rerank(k=2, batch_size=4096))[
            "all"
        ][3]
        == 6
    )


def test_small_pools_ties_and_margin_ties_by_hand(line):
    split, emb, model = line
    pools = np.zeros((4, 8), bool)
    for q, rows in enumerate([[1], [3], [5, 1, 3], [0, 5]]):  # false candidates per query
        pools[q, rows] = True
    with_true = pools.copy()
    with_true[np.arange(4), split.counter] = True
    shortlists = pool_shortlists(distances(emb.sim, split.query), {"few": with_true}, k=3)["few"]
    # q0's pool has 2 members: a NONE place; q2: P1 and P3 are both 10 from P2, the lower row first
    assert shortlists.tolist() == [[4, 1, NONE], [5, 3, NONE], [6, 5, 1], [5, 7, 0]]
    assert pool_ranks(model, emb, split, fixed_pools({"few": pools}), Rerank(k=3, batch_size=4096))[
        "few"
    ].tolist() == [1, 1, 2, 1]
    # a margin tie counts against: P1 scored like C0 for q0
    emb.pooled[1, 0] = 1.0
    assert pool_ranks(model, emb, split, fixed_pools({"few": pools}), Rerank(k=3, batch_size=4096))[
        "few"
    ].tolist() == [2, 1, 2, 1]
    rank, in_k = shortlist_ranks(np.array([[4, 1], [0, 2]]), np.array([[1.0, 1.0], [0.0, 0.0]]), np.array([4, 5]))
    assert rank.tolist() == [2, 0] and in_k.tolist() == [True, False]


# -- non-finite classifier outputs: an error naming the split and the count, never a hit ---------------------------
ROWS = np.array([[4, 1, 2], [5, 0, NONE], [0, 1, 2]])  # true counters 4 and 5 listed; query 2's (6) is not
TRUE = np.array([4, 5, 6])


@pytest.mark.parametrize(
    "margins, count",
    [
        (np.full((3, 3), np.nan), 8),  # all NaN: 8 listed places (one is NONE)
        (np.array([[np.nan, 1.0, 2.0], [3.0, 1.0, 0.0], [0.0, 0.0, 0.0]]), 1),  # the true counter's own margin
        (np.array([[3.0, np.nan, 2.0], [3.0, 1.0, 0.0], [0.0, 0.0, 0.0]]), 1),  # a rival's: NaN never beats anything
        (np.array([[3.0, 1.0, 2.0], [3.0, 1.0, 0.0], [np.inf, 0.0, 0.0]]), 1),  # inf, where the true counter is absent
    ],
)
def test_a_non_finite_margin_is_an_error_never_a_hit(margins, count):
    """NaN compares false: ranked, a NaN true counter would come first (all NaN: top-1 = recall@k = 2/3 here)."""
    with pytest.raises(
        NonFiniteMargins, match=rf"^{count} of 8 classifier margins on split val are not finite"
    ) as err:
        shortlist_ranks(ROWS, margins, TRUE, "val")
    assert (err.value.count, err.value.total, err.value.split) == (count, 8, "val")


def test_a_nan_at_an_empty_place_is_no_margin():
    """:data:`NONE` places read NaN from :func:`shortlist_margins` by design: they are skipped, not an error."""
    margins = np.array([[3.0, 1.0, 2.0], [3.0, 1.0, np.nan], [0.0, 0.0, 0.0]])
    rank, in_k = shortlist_ranks(ROWS, margins, TRUE, "val")
    assert rank.tolist() == [1, 1, 0] and in_k.tolist() == [True, True, False]


def test_query_ranks_refuse_non_finite_scores():
    scores, mask = np.zeros((2, 4)), np.array([[False, True, False, True], [True, False, True, False]])
    scores[:, 2:] = [[1.0, 0.5], [2.0, 1.5]]  # true columns 2 and 3
    assert query_ranks(scores, mask, np.array([2, 3])).tolist() == [1, 2]
    scores[0, 2] = np.nan  # query 0's true counter
    with pytest.raises(NonFiniteMargins, match="1 of 2 true-counter scores on split test"):
        query_ranks(scores, mask, np.array([2, 3]), "test")
    scores[0, 2], scores[1, 0] = 1.0, -np.inf  # a candidate of query 1
    with pytest.raises(NonFiniteMargins, match="1 of 4 candidate scores are not finite"):
        query_ranks(scores, mask, np.array([2, 3]))


def test_nan_classifier_in_retrieve_rerank_names_the_split(line):
    split, emb, model = line
    with torch.no_grad():
        model.head.out.bias[1] = float("nan")
    with pytest.raises(NonFiniteMargins, match=r"^8 of 8 classifier margins on split train are not finite"):
        retrieve_rerank(model, emb, split, Rerank(k=2, index="exact"))
    with pytest.raises(NonFiniteMargins, match="on split train"):
        pool_ranks(model, emb, split, fixed_pools({"all": per_epoch_pool(split)}), Rerank(k=2, batch_size=4096))


@pytest.mark.slow
def test_nan_margins_stop_a_run_as_diverged(tmp_path, monkeypatch):
    """Finite loss and embeddings, NaN classifier margins at evaluation: the run stops as diverged, naming the split
    and the count, instead of logging top-1 = recall@k."""
    import json

    import biencoder.engine.retrieval.rerank as rerank
    from biencoder.engine.training.epoch import Diverged
    from biencoder.engine.training.run import run
    from conftest import FAST, compose_cfg

    monkeypatch.setattr(
        rerank, "pair_margins", lambda model, emb, queries, rows, *args: np.full(len(rows), np.nan, np.float32)
    )
    out = tmp_path / "run"
    with pytest.raises(Diverged, match=r"epoch 0: non-finite train classifier margins \((\d+) of \1\)"):
        run(compose_cfg(FAST + ["trainer.max_epochs=1", "eval.tasks=false"]), out)
    final = json.loads((out / "final.json").read_text())
    assert final["status"] == "diverged" and final["epoch"] == 0
    assert final["what"].startswith("train classifier margins (")
    rows = out / "metrics.jsonl"
    assert not rows.exists() or not rows.read_text().strip()  # no row with a top-1 from NaN margins


@pytest.mark.parametrize("space", ["sim", "encoder"])
def test_the_two_shortlist_finders_agree_on_demo(tiny_model_and_tokenizer, demo_corpus, space):
    """The per-epoch shortlists (NeighbourIndex, both indexes) are the epa pool's shortlists, so the per-epoch
    top-1 is the 8 tasks' epa rerank accuracy on every split."""
    model, tokenizer = tiny_model_and_tokenizer
    for name in ("train", "test"):
        split = demo_corpus.paired(name)
        emb = encode(model, TokenizedTexts(split.texts, tokenizer, 64))
        epa = per_epoch_pool(split)
        epa[np.arange(split.n_pairs), split.counter] = True
        dist = distances(emb.retrieval(space), split.query)
        expected = pool_shortlists(dist, {"epa": epa}, 5)["epa"]
        rows, found = retrieve(emb.retrieval(space).numpy(), split, 5, "exact")
        assert rows.tolist() == expected.tolist()
        # a BallTree orders equal distances (duplicate texts, equal vectors) its own way: the same distances
        rows, found = retrieve(emb.retrieval(space).numpy(), split, 5, "balltree")
        np.testing.assert_allclose(found, np.take_along_axis(dist, expected, 1), rtol=1e-12)
        tasks = evaluate_tasks(split, "rerank", model, emb, Rerank(k=5, batch_size=4096, space=space))
        for index in ("exact", "balltree"):
            metrics, _ = retrieve_rerank(model, emb, split, Rerank(k=5, index=index, space=space))
            assert metrics["top1"] == tasks["epa"]["accuracy_at_1"]
        if space == "sim":  # the nearest candidate is the pool's first by distance
            assert metrics["retrieval_top1"] == evaluate_tasks(split, "sim", emb=emb)["epa"]["accuracy_at_1"]
        assert task_masks(candidate_types(split))["epa"].tolist() == per_epoch_pool(split).tolist()


def test_the_pair_batch_size_changes_no_number(tiny_model_and_tokenizer, demo_corpus):
    """eval.pair_batch_size is one of the keys that change no result (settings.NON_RESULT_KEYS), and its default
    differs by device (256 on a CPU, 4096 on a GPU): the per-epoch metrics and per-query hits are the same for any
    block size, a partial last block included. The margins agree to float32 rounding: BLAS may compute a block's
    leftover rows with another kernel (blocks of 7 rows differed by ~1e-6 here; multiples of 8 were equal to the
    bit)."""
    from biencoder.engine.machine.runtime import Runtime
    from biencoder.engine.modeling.encoding import embed_pooled

    model, tokenizer = tiny_model_and_tokenizer
    split = demo_corpus.paired("test")
    pooled = encode(model, TokenizedTexts(split.texts, tokenizer, 64)).pooled
    results = []
    for size in (7, 16, 64, 256):  # 160 pairs: partial blocks, and one block
        emb = embed_pooled(model, pooled, batch_size=size)
        margins = shortlist_margins(
            model, emb, split.query, [retrieve(emb.sim.numpy(), split, 5, "exact")[0]], batch_size=size
        )
        results.append(
            (emb.sim, margins[0], retrieve_rerank(model, emb, split, Rerank(k=5, batch_size=size, index="exact")))
        )
    for sim, margins, (metrics, hits) in results[1:]:
        torch.testing.assert_close(sim, results[0][0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(margins, results[0][1], rtol=1e-5, atol=1e-5)
        assert metrics == results[0][2][0] and np.array_equal(hits, results[0][2][1])
    cpu, gpu = Runtime(torch.device("cpu"), "fp32"), Runtime(torch.device("cuda", 0), "bf16")
    assert (cpu.pair_batch_size(None), gpu.pair_batch_size(None), cpu.pair_batch_size(64)) == (256, 4096, 64)


def test_a_runs_rerank_settings_are_its_config():
    """Rerank.of_run takes eval.k, eval.pair_batch_size (null: the device's), eval.index and eval.retrieve from the
    config, and the device from the runtime."""
    from biencoder.engine.config.schema import EvalSchema
    from biencoder.engine.machine.runtime import Runtime

    cpu = Runtime(torch.device("cpu"), "fp32")
    settings = EvalSchema(k=7, pair_batch_size=64, index="balltree", retrieve="encoder")
    assert Rerank.of_run(settings, cpu) == Rerank(7, 64, torch.device("cpu"), "balltree", "encoder")
    assert Rerank.of_run(EvalSchema(pair_batch_size=None), cpu).batch_size == 256


def test_sorted_unique_is_numpys_unique():
    from biencoder.engine.retrieval.rerank import sorted_unique

    rng = np.random.default_rng(0)
    for values in (
        rng.integers(0, 50, 300),
        rng.integers(-5, 10**9, 1000),
        np.array([7]),
        np.array([], dtype=np.int64),
        np.array([3, 3, 3]),
    ):
        got = sorted_unique(values)
        np.testing.assert_array_equal(got, np.unique(values))
        assert got.dtype == values.dtype


@pytest.mark.slow
def test_nan_margins_in_the_within_group_top1_stop_a_run_as_diverged(tmp_path, monkeypatch):
    """Pair files with groups: the within-group shortlists score other (query, candidate) pairs than the per-epoch
    ones, so NaN margins there alone must also end the run as diverged, naming the split, never as a bare error."""
    import json

    import biencoder.engine.retrieval.groups as groups
    from biencoder.engine.training.epoch import Diverged
    from biencoder.engine.training.run import run
    from conftest import FAST, compose_cfg

    def nan_margins(model, emb, queries, row_lists, *args):
        return [np.full(rows.shape, np.nan, np.float32) for rows in row_lists]

    monkeypatch.setattr(groups, "shortlist_margins", nan_margins)
    out = tmp_path / "run"
    with pytest.raises(Diverged, match=r"epoch 0: non-finite train classifier margins \((\d+) of \1\)"):
        run(compose_cfg(FAST + ["data=pairs_demo", "trainer.max_epochs=1", "eval.tasks=false"]), out)
    final = json.loads((out / "final.json").read_text())
    assert final["status"] == "diverged" and final["what"].startswith("train classifier margins (")


def test_pool_ranks_of_two_queries_beyond_their_shortlist(line):
    """k=1 with C2 moved to 27: for q2 (at 20) C1 ties its counter at 7 and, the lower row, takes the one place;
    for q3 (at 30) C2 does. Each one's rank counts only its own pool members nearer than its counter."""
    split, emb, model = line
    emb.sim[6, 0] = 27.0
    ranks = pool_ranks(model, emb, split, fixed_pools({"all": per_epoch_pool(split)}), Rerank(k=1, batch_size=4096))[
        "all"
    ]
    # q2: the one listed + 1, nothing unlisted within 7 → 2 | q3: C2 listed + 1 + P2 (10), C1 (17), P1 (20) → 5
    assert ranks.tolist() == [1, 1, 2, 5]


def test_per_epoch_rerank_of_some_queries(line):
    """``pairs`` (eval.sample's queries): the metrics of those queries alone, each in the whole split's pool."""
    split, emb, model = line
    metrics, hits = retrieve_rerank(model, emb, split, Rerank(k=2, index="exact"), pairs=np.array([0, 2]))
    # as in test_per_epoch_rerank_by_hand: q0 a hit, q2 its counter second after reranking; both nearest first
    assert hits.tolist() == [True, False]
    assert metrics == {
        "top1": 0.5,
        "retrieval_top1": 1.0,
        "recall_at_k": 1.0,
        "mrr": (1 + 1 / 2) / 2,
        "queries": 2,
        "k": 2,
        "ndcg_at_10": (1 + 1 / np.log2(3)) / 2,
        "mrr_at_10": (1 + 1 / 2) / 2,
        "recall_at_100": 1.0,
    }


def test_distances_are_computed_from_the_differences():
    """Far from the origin, ||a||² + ||b||² − 2ab loses the small distances to cancellation; the differences keep
    them (float64, to the last digits), so equal vectors are at distance exactly 0. No query: no row."""
    rng = np.random.default_rng(0)
    x = 1e4 + 1e-3 * rng.normal(size=(40, 16))  # more rows than torch's cut-over to the matrix-product form
    x[1] = x[0]
    got = distances(torch.from_numpy(x), np.arange(40))
    expected = np.sqrt(((x[:, None, :] - x[None, :, :]) ** 2).sum(axis=-1))
    np.testing.assert_allclose(got, expected, rtol=1e-9, atol=0)
    assert got[0, 1] == got[1, 0] == got[0, 0] == 0.0
    none = distances(torch.from_numpy(x), np.array([], dtype=np.int64))
    assert none.shape == (0, 40)


def test_first_kept_keeps_the_neighbours_order():
    """Of 40 neighbours (more than numpy's unstable sorts leave in order), the first k kept, nearest first; NONE
    (distance inf) fills the places of a query with fewer kept."""
    from biencoder.engine.retrieval.order import first_kept

    rng = np.random.default_rng(0)
    keep = rng.random((50, 40)) < 0.6
    rows = rng.permutation(2000).reshape(50, 40)
    dist = np.sort(rng.random((50, 40)), axis=1)
    got_rows, got_dist = first_kept(rows, dist, keep, 25)
    assert (keep.sum(axis=1) < 25).any() and (keep.sum(axis=1) > 25).any()
    for i in range(50):
        n = min(25, keep[i].sum())
        assert got_rows[i].tolist() == rows[i][keep[i]][:n].tolist() + [NONE] * (25 - n)
        assert got_dist[i].tolist() == dist[i][keep[i]][:n].tolist() + [np.inf] * (25 - n)


def test_a_k_above_the_smallest_pool_is_cut_to_it(line):
    """k=10 on 8 rows: q0's pool (all but itself and C3, its counter's twin) has 6 members, the smallest; every query
    gets 6, nearest first (q1 has 7: P0 and P2 tie at 10, the lower row first, C2 at 10.5 is the one left out)."""
    split, emb, model = line
    rows, dist = retrieve(emb.sim.numpy(), split, k=10, index="exact")
    assert rows.shape == (4, 6)
    assert rows[1].tolist() == [5, 4, 7, 0, 2, 6] and dist[1].tolist() == [3.0, 9.0, 9.5, 10.0, 10.0, 10.5]
    metrics, _ = retrieve_rerank(model, emb, split, Rerank(k=10, index="exact"))
    assert metrics["k"] == 6 and metrics["recall_at_k"] == 1.0


def test_a_querys_other_relevant_documents_never_count_against_its_first(tiny_model_and_tokenizer, tmp_path):
    """A BEIR query with two relevant documents: the other one (grade 1) is nearer and has the higher margin than
    its first (grade 2), yet neither the reranked rank nor the retrieved place of the first counts it; the final
    ranking lists both, by margin."""
    docs = [{"_id": f"d{i}", "title": "", "text": f"doc {i}"} for i in range(4)]
    queries = [{"_id": "q0", "text": "query 0"}, {"_id": "q1", "text": "query 1"}]
    folder = beir_folder(tmp_path / "b", docs, queries, {"test.tsv": ["q0\td0\t2", "q0\td1\t1", "q1\td2\t1"]})
    split = read_beir(folder).paired("test", "all")
    #        rows: q0   q1    d0   d1   d2    d3
    position = [0.0, 10.0, 1.0, 0.5, 11.0, 2.0]
    margin = [0.0, 0.0, 1.0, 5.0, 2.0, 0.5]
    sim, pooled = torch.zeros(6, 128), torch.zeros(6, 32)
    sim[:, 0], pooled[:, 0] = torch.tensor(position), torch.tensor(margin)
    ranks = rerank_ranks(candidate_scorer(tiny_model_and_tokenizer[0]), Embeddings(sim, pooled), split, Rerank(k=3))
    # q0's shortlist: d1 (0.5 away), d0 (1), d3 (2); d1 is relevant, so d0 is first by place and by margin (1 > 0.5)
    # q1's: d2 (1), d3 (8), d0 (9); d2's margin 2 beats 0.5 and 1
    assert ranks.retrieved.rank.tolist() == [1, 1]
    assert ranks.reranked.rank.tolist() == [1, 1]
    # the final ranking of q0 by margin: d1 (5), d0 (1), d3; its relevant documents by grade: d0, then d1
    assert ranks.final.rank.tolist() == [[2, 1], [1, NOT_LISTED]]
