"""The data path in blocks of queries (engine/retrieval/order.py, rerank.py, engine/retrieval/official_tasks.py,
engine/retrieval/negatives.py): the same ranks, hits, shortlists and negatives as one pass over the whole [Q, 2Q]
matrix, ties included, and memory that does not hold it.

The references below are that whole-matrix pass, written out as it was before the blocks (8e61826)."""

import tracemalloc

import numpy as np
import pandas as pd
import pytest
import torch

from biencoder.engine.data.corpus import PairedSplit
from biencoder.engine.modeling.model import Embeddings
from biencoder.engine.retrieval import negatives, order
from biencoder.engine.retrieval.negatives import Mining, mine_negatives
from biencoder.engine.retrieval.official_tasks import (
    NOT_A_CANDIDATE,
    TASKS,
    TaskPools,
    baseline_ranks,
    block_ranks,
    candidate_types,
    evaluate_tasks,
    pool_sizes,
    scorer_of,
    task_masks,
    tfidf_scores,
)
from biencoder.engine.retrieval.order import NONE, query_blocks, retrieve
from biencoder.engine.retrieval.pools import pool_ranks, pool_shortlists, query_ranks
from biencoder.engine.retrieval.rerank import (
    Rerank,
    pool_mask,
    retrieve_rerank,
    shortlist_margins,
    shortlist_ranks,
)
from biencoder.engine.retrieval.search import distances
from helpers import tied_split


# -- the whole-matrix references ------------------------------------------------------------------------------------
def whole_types(split):
    """[Q, 2Q] candidate types of every query at once."""
    t = split.table
    theme, debate, stance = (pd.factorize(col)[0] for col in (t["theme"], t["theme"] + "/" + t["debate"], t["stance"]))
    q, c = split.query, split.counter
    same_debate, same_theme = debate[q][:, None] == debate[None, :], theme[q][:, None] == theme[None, :]
    same_side = stance[q][:, None] == stance[None, :]
    counter = np.broadcast_to(split.is_counter[None, :], same_debate.shape)
    debate_type = np.select([counter & same_side, counter & ~same_side, ~counter & ~same_side], [0, 1, 2], 3)
    types = np.where(same_debate, debate_type, np.where(same_theme, 4, 6) + ~counter).astype(np.int8)
    types[~split.is_candidate(np.broadcast_to(np.arange(len(t)), types.shape))] = NOT_A_CANDIDATE
    types[np.arange(len(q)), c] = NOT_A_CANDIDATE
    return types


def whole_scores(split, score, model=None, emb=None, batch_size=4096):
    """[Q, 2Q] scores of every query at once."""
    if score == "tfidf":
        from sklearn.feature_extraction.text import TfidfVectorizer

        matrix = TfidfVectorizer(sublinear_tf=True).fit_transform(split.texts)
        return (matrix[split.query] @ matrix.T).toarray().astype(np.float32)
    if score == "encoder_cosine":
        a = torch.nn.functional.normalize(emb.pooled[split.query].float(), dim=1)
        return (a @ torch.nn.functional.normalize(emb.pooled.float(), dim=1).T).numpy()
    if score == "sim":
        return -distances(emb.sim, split.query)
    every = np.broadcast_to(np.arange(len(split.texts)), (split.n_pairs, len(split.texts)))
    return shortlist_margins(model, emb, split.query, [every], batch_size)[0]


def whole_pool_ranks(model, emb, split, pools, k, space):
    """pool_ranks of whole [Q, 2Q] masks in one pass."""
    q, true, every = split.query, split.counter, np.arange(split.n_pairs)
    dist = distances(emb.retrieval(space), q)
    with_true = {}
    for name, mask in pools.items():
        with_true[name] = mask.copy()
        with_true[name][every, true] = True
    shortlists = pool_shortlists(dist, with_true, k)
    margins = shortlist_margins(model, emb, q, list(shortlists.values()), 4096)
    ranks = {}
    for (name, rows), m in zip(shortlists.items(), margins, strict=True):
        rank, in_k = shortlist_ranks(rows, m, true)
        listed = np.zeros_like(pools[name])
        np.put_along_axis(listed, np.where(rows == NONE, true[:, None], rows), True, axis=1)
        behind = (rows != NONE).sum(axis=1) + 1 + (pools[name] & ~listed & (dist <= dist[every, true][:, None])).sum(1)
        ranks[name] = np.where(in_k, rank, behind)
    return ranks


# -- a split full of ties (helpers.tied_split) ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def tied():
    return tied_split()


def cells_choices(split):
    """One query a block, a few with a remainder, one block."""
    return [1, 3 * len(split.table) + 5, order.BLOCK_CELLS]


def test_the_split_has_what_the_blocks_must_keep(tied):
    split, emb = tied
    assert split.twins_of_true_counter().max() >= 1
    dist = distances(emb.sim, split.query)
    assert (dist[np.arange(split.n_pairs), split.counter][:, None] == dist).sum() > 3 * split.n_pairs  # distance ties


def test_query_blocks_cover_every_query_once_within_the_cells():
    for n, width, cells, multiple in [(10, 4, 12, 1), (10, 4, 3, 1), (7, 100, 10**6, 1), (0, 5, 10, 1), (9, 6, 40, 4)]:
        blocks = query_blocks(n, width, cells, multiple)
        assert np.concatenate(blocks).tolist() == list(range(n))
        assert all(len(b) * width <= max(cells, width * multiple) for b in blocks)
        assert all(len(b) % multiple == 0 for b in blocks[:-1])
    assert [len(b) for b in query_blocks(9, 6, 40, 4)] == [4, 4, 1]  # 6 queries fit, 4 is the multiple below


def test_candidate_types_of_a_block_are_the_rows_of_all(tied):
    split, _ = tied
    whole = whole_types(split)
    assert np.array_equal(candidate_types(split), whole)
    pairs = np.array([5, 0, 31, 56])
    assert np.array_equal(candidate_types(split, pairs), whole[pairs])
    assert np.array_equal(pool_mask(split, pairs), whole[pairs] != NOT_A_CANDIDATE)


@pytest.mark.parametrize("space", ["sim", "encoder"])
def test_pool_ranks_in_blocks_are_the_whole_matrix_ranks(tiny_model_and_tokenizer, tied, space):
    model = tiny_model_and_tokenizer[0]
    split, emb = tied
    expected = whole_pool_ranks(model, emb, split, task_masks(whole_types(split)), 3, space)
    for cells in cells_choices(split):
        got = pool_ranks(model, emb, split, TaskPools(split), Rerank(k=3, batch_size=4096, space=space, cells=cells))
        assert {t: r.tolist() for t, r in got.items()} == {t: r.tolist() for t, r in expected.items()}
    assert max(r.max() for r in expected.values()) > 3  # some true counters fall behind the shortlist


@pytest.mark.parametrize("score", ["sim", "tfidf", "encoder_cosine", "classifier"])
def test_scores_in_blocks_rank_as_the_whole_matrix(tiny_model_and_tokenizer, tied, score):
    model = tiny_model_and_tokenizer[0]
    split, emb = tied
    whole = whole_scores(split, score, model, emb, batch_size=64)
    expected = {t: query_ranks(whole, m, split.counter) for t, m in task_masks(whole_types(split)).items()}
    results = []
    for cells in cells_choices(split):
        multiple = 64 // np.gcd(64, len(split.table)) if score == "classifier" else 1
        scorer = scorer_of(split, score, model, emb, "cpu", 64)
        got = block_ranks(split, scorer, TaskPools(split), cells=cells, multiple=multiple)
        assert {t: r.tolist() for t, r in got.items()} == {t: r.tolist() for t, r in expected.items()}, cells
        if score != "encoder_cosine":  # a BLAS rounds a float32 dot product by where it sits (cosine_scorer)
            assert np.array_equal(scorer(np.arange(split.n_pairs)), whole)
        results.append(evaluate_tasks(split, score, model, emb, Rerank(batch_size=64, cells=cells)))
    assert results[0] == results[1] == results[2]
    assert all(results[0][t]["candidates"] == int(m.sum()) for t, m in task_masks(whole_types(split)).items())


def test_query_blocks_leave_the_classifier_batches_of_one_whole_pass(tiny_model_and_tokenizer, tied, monkeypatch):
    """evaluate_tasks(score=classifier) scores B queries x 2Q rows a block; B is a multiple of batch / gcd(batch, 2Q),
    so every head call sees the same pairs, in the same places, as one pass over all pairs would: a margin that a BLAS
    rounds by its place in the batch cannot differ between block sizes."""
    model = tiny_model_and_tokenizer[0]
    split, emb = tied
    assert len(split.table) % 64  # 2Q not a multiple of the batch: blocks of any size would cut batches apart
    gather = model.head.gather_pair_features

    def batches_of(cells: int) -> list[list[tuple[int, int]]]:
        seen = []

        def recording(emb, rows_a, rows_b, out):
            seen.append(list(zip(rows_a.tolist(), rows_b.tolist(), strict=True)))
            return gather(emb, rows_a, rows_b, out)

        monkeypatch.setattr(model.head, "gather_pair_features", recording)
        evaluate_tasks(split, "classifier", model, emb, Rerank(batch_size=64, cells=cells))
        return seen

    whole = batches_of(order.BLOCK_CELLS)
    assert len(whole) > 1 and all(len(b) == 64 for b in whole[:-1])
    for cells in (1, 3 * len(split.table) + 5):
        assert batches_of(cells) == whole, cells


def test_equal_vectors_tie_in_the_cosine_whatever_the_blocks(tied):
    """A point with its true counter's text ties it (and so ranks it second) under the cosine, in any block."""
    split, emb = tied
    scorer = scorer_of(split, "encoder_cosine", None, emb, "cpu", 64)
    for cells in cells_choices(split):
        for block in query_blocks(split.n_pairs, len(split.table), cells):
            scores = scorer(block)
            same = split.text_id[None, :] == split.text_id[split.counter[block]][:, None]
            true = scores[np.arange(len(block)), split.counter[block]]
            assert (scores[same] == np.repeat(true, same.sum(axis=1))).all()
    # queries whose true counter's text is another pair's point: that point ties it, so it is never first
    tied_point = [
        i
        for i in range(split.n_pairs)
        if (split.text_id[: split.n_pairs] == split.text_id[split.counter[i]]).sum()
        - (split.text_id[i] == split.text_id[split.counter[i]])
        > 0
    ]
    assert len(tied_point) >= 3
    assert (baseline_ranks(split, emb.pooled, cells=1)["encoder_cosine"][tied_point] >= 2).all()


def test_baselines_in_blocks_and_on_a_sample_are_the_whole_matrix_ranks(tied):
    split, emb = tied
    epa = task_masks(whole_types(split))["epa"]
    expected = {
        score: query_ranks(whole_scores(split, score, emb=emb), epa, split.counter)
        for score in ("encoder_cosine", "tfidf")
    }
    for cells in cells_choices(split):
        got = baseline_ranks(split, emb.pooled, cells=cells)
        assert {s: r.tolist() for s, r in got.items()} == {s: r.tolist() for s, r in expected.items()}
    sample = np.array([3, 9, 10, 40])
    got = baseline_ranks(split, emb.pooled, pairs=sample, cells=2 * len(split.table))
    assert {s: r.tolist() for s, r in got.items()} == {s: r[sample].tolist() for s, r in expected.items()}
    assert np.array_equal(tfidf_scores(split, sample), whole_scores(split, "tfidf")[sample])


def test_pool_sizes_in_blocks(tied):
    split, _ = tied
    whole = task_masks(whole_types(split))
    for cells in cells_choices(split):
        assert pool_sizes(split, cells) == {
            t: {"queries": split.n_pairs, "candidates": int(whole[t].sum())} for t in TASKS
        }


@pytest.mark.parametrize("index", ["exact", "balltree"])
def test_retrieval_and_mining_in_search_blocks(tiny_model_and_tokenizer, tied, monkeypatch, index):
    """A block of 5 queries at a time finds the shortlists, hits and negatives one search of all of them finds (the
    negatives of every selection rule: the hardest, a margin, a rank range); the shortlists of some queries
    (``pairs``) are theirs in the shortlists of all."""
    model = tiny_model_and_tokenizer[0]
    split, emb = tied
    sim = emb.sim.numpy()
    pairs = np.array([0, 1, 2, 7, 8, 20, 33, 50, 56])
    rules = [
        Mining(n_neighbors=1, index=index),
        Mining(index=index, relative_margin=0.1),
        Mining(index=index, rank_range=(2, 4)),
    ]

    def everything():
        return [
            retrieve(sim, split, 4, index),
            retrieve(sim, split, 4, index, pairs=pairs),
            retrieve_rerank(model, emb, split, Rerank(k=4, index=index)),
            *(mine_negatives(sim, split, 0.0, np.random.default_rng(0), rule) for rule in rules),
        ]

    whole = everything()
    monkeypatch.setattr(order, "SEARCH_BLOCK", 5)
    monkeypatch.setattr(negatives, "SEARCH_BLOCK", 5)
    assert negatives.row_block(len(sim)) == 5 < split.n_pairs / 2  # several blocks of queries, not one
    blocked = everything()
    for a, b in zip(whole[:2], blocked[:2], strict=True):
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    assert np.array_equal(whole[1][0], whole[0][0][pairs]) and np.array_equal(whole[1][1], whole[0][1][pairs])
    assert whole[2][0] == blocked[2][0] and np.array_equal(whole[2][1], blocked[2][1])
    for a, b in zip(whole[3:], blocked[3:], strict=True):
        assert np.array_equal(a.row, b.row) and np.array_equal(a.distance, b.distance)


def test_retrieval_of_the_positives_pool_in_search_blocks(tiny_model_and_tokenizer, tied, monkeypatch):
    """data.pool=positives searches the positive rows only; in blocks of 5 queries it finds what one search finds, and
    the baselines rank in that pool in any block of queries."""
    from dataclasses import replace

    model = tiny_model_and_tokenizer[0]
    split, emb = tied
    split = replace(split, pool="positives")
    sim = emb.sim.numpy()
    whole = retrieve(sim, split, 4, "exact"), retrieve_rerank(model, emb, split, Rerank(k=4, index="exact"))
    expected = baseline_ranks(split, emb.pooled)
    monkeypatch.setattr(order, "SEARCH_BLOCK", 5)
    rows, dist = retrieve(sim, split, 4, "exact")
    assert np.array_equal(rows, whole[0][0]) and np.array_equal(dist, whole[0][1])
    assert split.is_counter[rows].all()
    metrics, hits = retrieve_rerank(model, emb, split, Rerank(k=4, index="exact"))
    assert metrics == whole[1][0] and np.array_equal(hits, whole[1][1])
    got = baseline_ranks(split, emb.pooled, cells=1)
    assert {s: r.tolist() for s, r in got.items()} == {s: r.tolist() for s, r in expected.items()}


def test_mining_doubles_k_per_query_in_any_block(monkeypatch):
    """40 pairs share 2 counter texts: a point's nearest rows are mostly banned, so its k doubles until it finds one;
    blocks of 3 queries give every row a search of all gives."""
    from helpers import paired_split

    split = paired_split([f"p{i}" for i in range(40)], [f"c{i % 2}" for i in range(40)])
    sim = np.zeros((80, 2))
    sim[:40, 0] = np.arange(40)
    sim[40:, 0] = np.arange(40) + 0.25  # every counter next to its point: the nearest rows are banned twins
    whole = mine_negatives(sim, split, 0.0, np.random.default_rng(0), Mining(n_neighbors=1, index="exact"))
    monkeypatch.setattr(negatives, "SEARCH_BLOCK", 3)
    blocked = mine_negatives(sim, split, 0.0, np.random.default_rng(0), Mining(n_neighbors=1, index="exact"))
    assert np.array_equal(whole.row, blocked.row)
    assert (split.text_id[whole.row] != split.text_id[split.counter]).all()


# -- memory ---------------------------------------------------------------------------------------------------------
def big_split(n_pairs: int, seed: int = 0):
    """n_pairs pairs of short generated texts (no shared twins) in 20 groups, with random tiny-model-sized vectors."""
    rng = np.random.default_rng(seed)
    words = np.array([f"w{i}" for i in range(2000)])
    texts = [" ".join(row) for row in words[rng.integers(0, len(words), (2 * n_pairs, 5))]]
    group = np.tile(rng.integers(0, 20, n_pairs), 2).astype(str)
    table = pd.DataFrame(
        {
            "theme": group,
            "debate": group,
            "stance": "pro",
            "kind": ["point"] * n_pairs + ["counter"] * n_pairs,
            "text": texts,
            "pair_id": [f"p{i}" for i in range(n_pairs)] * 2,
        }
    )
    table["text_id"] = pd.factorize(table["text"])[0]
    sim = torch.from_numpy(rng.normal(size=(2 * n_pairs, 128))).float()
    return PairedSplit("test", table), Embeddings(sim, torch.from_numpy(rng.normal(size=(2 * n_pairs, 32))).float())


@pytest.mark.slow
def test_the_evaluation_never_holds_the_whole_matrix(tiny_model_and_tokenizer):
    """6000 pairs: a [Q, 2Q] float32 matrix is 288 MB (float64 distances 576 MB). Mining, the per-epoch retrieve +
    rerank, both baselines and the 8 tasks' pool sizes stay under half of the float32 one (numpy's allocations, which
    tracemalloc sees; torch's own are [block, 2Q] at most)."""
    model = tiny_model_and_tokenizer[0]
    split, emb = big_split(6000)
    whole = split.n_pairs * len(split.table) * 4
    cap = whole // 2
    tracemalloc.start()
    try:
        mine_negatives(emb.sim.numpy(), split, 0.5, np.random.default_rng(0), Mining(index="exact"))
        metrics, _ = retrieve_rerank(model, emb, split, Rerank(k=10, index="exact"))
        ranks = baseline_ranks(split, emb.pooled)
        sizes = pool_sizes(split)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert metrics["queries"] == 6000 and len(ranks["tfidf"]) == 6000
    assert sizes["epa"]["candidates"] == 6000 * (12000 - 2)
    assert peak < cap, f"peak {peak / 2**20:.0f} MB of numpy allocations; the whole matrix is {whole / 2**20:.0f} MB"


def test_texts_are_tokenised_in_blocks_to_the_same_ids(tiny_model_and_tokenizer, monkeypatch):
    """TokenizedTexts calls the tokenizer on CHUNK texts at a time (its output for 200 000 texts at once held 3.9 GB):
    the ids are those of one call."""
    from biencoder.engine.modeling.encoding import TokenizedTexts

    tokenizer = tiny_model_and_tokenizer[1]
    texts = [f"text number {i} " + "word " * (i % 9) for i in range(11)]
    whole = TokenizedTexts(texts, tokenizer, 8)
    monkeypatch.setattr(TokenizedTexts, "CHUNK", 3)
    blocked = TokenizedTexts(texts, tokenizer, 8)
    assert [ids.tolist() for ids in blocked.ids] == [ids.tolist() for ids in whole.ids]
    assert blocked.lengths.tolist() == whole.lengths.tolist() and max(whole.lengths) == 8
    one_call = tokenizer(texts, truncation=True, max_length=8)["input_ids"]
    assert [ids.tolist() for ids in blocked.ids] == one_call
