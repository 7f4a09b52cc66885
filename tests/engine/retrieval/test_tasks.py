import json

import numpy as np
import pytest
import torch

from biencoder.engine.data.corpus import read_corpus
from biencoder.engine.modeling.model import Embeddings
from biencoder.engine.retrieval.official_tasks import (
    TASKS,
    candidate_types,
    evaluate_tasks,
    pool_sizes,
    query_ranks,
    task_masks,
    tfidf_scores,
)
from biencoder.tasks import main
from conftest import grid_layout

# grid: 2 themes × 2 debates, 2 pairs per side. False candidates per query, counted by hand:
# sdoc 1 (the other same-side counter) | sdc +2 opposite counters = 3 | sdoa 1 + 2 opposite points = 3
# sda 1+2+2+1 = 6 | stc 3 + 4 counters of the other debate of the theme = 7 | sta 6 + 8 = 14
# epc 7 + 8 counters of the other theme = 15 | epa 14 + 16 = 30 (= 32 rows − query − true counter)
PER_QUERY = {"sdoc": 1, "sdc": 3, "sdoa": 3, "sda": 6, "stc": 7, "sta": 14, "epc": 15, "epa": 30}


@pytest.fixture
def grid(make_corpus):
    layout = grid_layout(themes=2, debates=2, per_side=2)
    # theme1/debate10 con01's counter repeats theme0/debate00 pro01's counter (the same text filed twice)
    twin = layout["test"]["theme0"]["debate00"]["pro"][0][1]
    point = layout["test"]["theme1"]["debate10"]["con"][0][0]
    layout["test"]["theme1"]["debate10"]["con"][0] = (point, twin)
    return read_corpus(make_corpus(layout)).paired("test")


def test_pool_sizes_by_hand(grid):
    sizes = pool_sizes(grid)
    for task, n in PER_QUERY.items():
        expected = 16 * n - (2 if task in ("epc", "epa") else 0)  # the twin leaves two queries' portal pools
        assert sizes[task] == {"queries": 16, "candidates": expected}, task


def test_types_of_one_query(grid):
    t = grid.table
    q = int(np.flatnonzero(t["pair_id"] == "theme0/debate00/pro01")[0])
    types = candidate_types(grid)[q]

    def row(pair_id, kind):
        return int(np.flatnonzero((t["pair_id"] == pair_id) & (t["kind"] == kind))[0])

    assert types[q] == -1 and types[row("theme0/debate00/pro01", "counter")] == -1
    assert types[row("theme1/debate10/con01", "counter")] == -1  # twin of the true counter
    named = {
        "debate-same-counter": row("theme0/debate00/pro02", "counter"),
        "debate-oppo-counter": row("theme0/debate00/con01", "counter"),
        "debate-oppo-point": row("theme0/debate00/con02", "point"),
        "debate-same-point": row("theme0/debate00/pro02", "point"),
        "theme-counter": row("theme0/debate01/pro01", "counter"),
        "theme-point": row("theme0/debate01/con01", "point"),
        "portal-counter": row("theme1/debate11/pro02", "counter"),
        "portal-point": row("theme1/debate10/pro01", "point"),
    }
    from biencoder.engine.retrieval.official_tasks import TYPES

    for name, r in named.items():
        assert TYPES[types[r]] == name


def test_one_ranking_by_hand(grid):
    t = grid.table

    def row(pair_id, kind):
        return int(np.flatnonzero((t["pair_id"] == pair_id) & (t["kind"] == kind))[0])

    q = row("theme0/debate00/pro01", "point")
    # distances from the query: true counter 2.0; a same-side counter 1.0; an opposite point 3.0; a theme
    # point 1.5; everything else 100
    position = np.full(len(t), 100.0)
    position[q] = 0.0
    position[row("theme0/debate00/pro01", "counter")] = 2.0
    position[row("theme0/debate00/pro02", "counter")] = 1.0
    position[row("theme0/debate00/con01", "point")] = 3.0
    position[row("theme0/debate01/pro01", "point")] = 1.5
    scores = -np.abs(position - position[q])[None, :]
    masks = {task: m[q : q + 1] for task, m in task_masks(candidate_types(grid)).items()}
    ranks = {
        task: 1 / query_ranks(scores, m, grid.counter[q : q + 1])[0] for task, m in masks.items()
    }  # MRR of one query
    assert ranks == {
        "sdoc": 1 / 2,
        "sdc": 1 / 2,
        "sdoa": 1 / 2,
        "sda": 1 / 2,
        "stc": 1 / 2,
        "sta": 1 / 3,
        "epc": 1 / 2,
        "epa": 1 / 3,
    }


def test_ties_count_against_and_all_scores_agree_on_a_perfect_model(grid):
    q, c = grid.query, grid.counter
    scores = np.zeros((len(q), len(grid.table)))
    all_ties = {task: query_ranks(scores, m, c) for task, m in task_masks(candidate_types(grid)).items()}
    assert all((ranks == 1).mean() == 0.0 for ranks in all_ties.values())  # accuracy@1 0: every tie counts against
    # a planted perfect sim space: each counter sits on its point, pairs far apart
    sim = torch.zeros(len(grid.table), 128)
    sim[q, 0] = torch.arange(len(q), dtype=torch.float) * 10
    sim[c, 0] = sim[q, 0] + 0.1
    emb = Embeddings(sim, sim[:, :32].clone())
    for score in ("sim", "encoder_cosine"):
        result = evaluate_tasks(grid, score, emb=emb)
        if score == "sim":
            assert all(r["accuracy_at_1"] == 1.0 and r["mrr"] == 1.0 for r in result.values())
        assert result["epa"]["candidates"] == 478


def test_tfidf_prefers_shared_words(make_corpus):
    words = iter(["apple", "bread", "cider", "dates", "eggs", "flour", "grape", "honey"] * 3)

    def side():
        return [(f"{w} {w} claim\nwe claim it", f"{w} rebuttal") for w in (next(words), next(words))]

    layout = {s: {"theme": {"debate": {"pro": side(), "con": side()}}} for s in ("training", "validation", "test")}
    split = read_corpus(make_corpus(layout)).paired("test")
    result = evaluate_tasks(split, "tfidf")
    # each point shares only its rare word with its own counter, and only common words with the rest
    assert result["epa"]["accuracy_at_1"] == 1.0 and set(result) == set(TASKS)
    assert tfidf_scores(split).dtype == np.float32  # the module's memory bound: [Q, 2Q] float32 scores


def test_zero_shot_cosine_ranks_by_angle_not_length(grid):
    """encoder_cosine is the cosine of the pooled vectors. Point i is e_i + u (u shared by all), its counter a tenth
    of it: cosine 1 with its point, against 1/2 for every other row. A dot product would put the other points
    (dot 1) before the true counter (dot 0.2)."""
    rows = len(grid.table)
    pooled = torch.zeros(rows, 64)
    pooled[:, 63] = 1.0  # u
    pooled[grid.query, grid.query] = 1.0
    pooled[grid.counter] = 0.1 * pooled[grid.query]
    result = evaluate_tasks(grid, "encoder_cosine", emb=Embeddings(torch.zeros(rows, 128), pooled))
    assert all(r["accuracy_at_1"] == 1.0 and r["mrr"] == 1.0 for r in result.values())


def test_cli_json(capsys):
    assert main(["demo", "--split", "test", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == set(TASKS) and out["epa"]["queries"] == 32
    assert main(["/does/not/exist"]) == 2
    capsys.readouterr()
    assert main(["demo", "--split", "validation", "--json"]) == 0  # the corpus's folder name works too
    assert json.loads(capsys.readouterr().out)["epa"]["queries"] == 32


def test_real_test_pools(real_corpus):
    split = real_corpus.paired("test")
    sizes = pool_sizes(split)
    assert {t: s["candidates"] for t, s in sizes.items()} == {
        "sdoc": 4052,
        "sdc": 9312,
        "sdoa": 9312,
        "sda": 18630,
        "stc": 189870,
        "sta": 379746,
        "epc": 1961182,
        "epa": 3922582,
    }
    assert all(s["queries"] == 1401 for s in sizes.values())
    # epa = every paired argument but the query and the true counter, less the true counter's 218 twins
    assert sizes["epa"]["candidates"] == 1401 * (2802 - 2) - 218
    # the paper's sdoa: 7.6 opposing-stance candidates per query on average, the true counter included
    assert sizes["sdoa"]["candidates"] / 1401 + 1 == pytest.approx(7.6, abs=0.1)


@pytest.mark.slow
def test_real_test_tfidf_baseline(real_corpus):
    """The lexical baseline on the official pools: a regression check of the whole protocol (measured 2026-11)."""
    result = evaluate_tasks(real_corpus.paired("test"), "tfidf")
    assert result["sdoc"]["accuracy_at_1"] == pytest.approx(0.712, abs=0.005)
    assert result["sdoa"]["accuracy_at_1"] == pytest.approx(0.495, abs=0.005)
    assert result["epa"]["accuracy_at_1"] == pytest.approx(0.259, abs=0.005)
    accs = [result[t]["accuracy_at_1"] for t in ("sdoc", "sdc", "sda", "sta")]
    assert accs == sorted(accs, reverse=True)  # bigger pools are harder


def test_the_task_table_gives_each_splits_own_pool_size():
    """A run's summary table shows val and test side by side; their pools differ, so each split's average number of
    false candidates is shown (it once showed val's under both)."""
    from biencoder.engine.retrieval.official_tasks import TASKS
    from biencoder.report.run_summary import format_tasks

    def results(per_query, queries):
        return {
            t: {"accuracy_at_1": 0.5, "mrr": 0.75, "queries": queries, "candidates": per_query * queries, "groups": {}}
            for t in TASKS
        }

    lines = format_tasks({"val": results(10, 4), "test": results(20, 5)}).splitlines()
    assert lines[0] == "| task | avg false cands (val / test) | val acc@1 | val MRR | test acc@1 | test MRR |"
    assert lines[2] == "| sdoc | 10.0 / 20.0 | 0.500 | 0.750 | 0.500 | 0.750 |"
    assert format_tasks({"test": results(20, 5)}).splitlines()[2] == "| sdoc | 20.0 | 0.500 | 0.750 |"


def test_an_unknown_score_is_named(grid):
    with pytest.raises(ValueError, match="^unknown score 'cosine'$"):
        evaluate_tasks(grid, "cosine", emb=Embeddings(torch.zeros(32, 128), torch.zeros(32, 32)))


def test_baseline_ranks_are_the_epa_ranks_of_the_two_baselines(grid):
    """The summary's zero-shot and TF-IDF top-1 are the epa task's accuracy@1 under each score, query by query."""
    from biencoder.engine.retrieval.official_tasks import BASELINES, baseline_ranks

    pooled = torch.from_numpy(np.random.default_rng(6).normal(size=(len(grid.table), 32))).float()
    ranks = baseline_ranks(grid, pooled)
    assert set(ranks) == set(BASELINES) == {"encoder_cosine", "tfidf"}
    emb = Embeddings(torch.zeros(len(grid.table), 128), pooled)
    for score, rank in ranks.items():
        epa = evaluate_tasks(grid, score, emb=emb)["epa"]
        assert rank.shape == (16,) and len(set(rank.tolist())) >= 2  # ranks differ: a real comparison
        assert ((rank == 1).mean(), (1 / rank).mean()) == (epa["accuracy_at_1"], epa["mrr"])
