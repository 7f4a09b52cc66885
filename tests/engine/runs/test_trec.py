"""A run's test ranking as TREC files (biencoder.engine.runs.trec): the lines by hand, and a real run's files read by
ir-measures (trec_eval's measures through pytrec_eval) give the run's own figures of its best epoch."""

import gzip
import json

import ir_measures
import numpy as np
import pytest
from ir_measures import RR, P, R, nDCG

from biencoder.engine.retrieval.metrics import Ranks, mrr_at, ndcg_at, recall_at
from biencoder.engine.retrieval.order import NONE
from biencoder.engine.retrieval.rerank import listed_ranks
from biencoder.engine.runs.trec import QRELS_FILE, RUN_FILE, qrels_text, run_text, trec_id
from biencoder.engine.training.run import run
from conftest import FAST, compose_cfg


def library(measures: list, qrels: str, run_lines: str) -> dict:
    """ir-measures' figures (pytrec_eval: trec_eval's own code) of ``measures`` for a run and qrels in TREC text.
    ``RR @ n`` is trec_eval's ``recip_rank`` of the run cut to its ``n`` best-scored lines per query (``trec_eval -M
    n``): trec_eval has no cut of its own for it, and ir-measures 0.4.3's ``RR@10`` through pytrec_eval gave the
    uncut reciprocal rank on a run of 63 places (0.0893 where the cut one is 0.0596)."""
    judged = list(ir_measures.read_trec_qrels(qrels))
    lines = list(ir_measures.read_trec_run(run_lines))
    out = {
        m: v
        for m, v in ir_measures.pytrec_eval.calc_aggregate(
            [m for m in measures if m.NAME != "RR"], judged, lines
        ).items()
    }
    for m in (m for m in measures if m.NAME == "RR"):
        by_query: dict[str, list] = {}
        for line in lines:
            by_query.setdefault(line.query_id, []).append(line)
        cut = [x for q in by_query.values() for x in sorted(q, key=lambda x: -x.score)[: m["cutoff"]]]
        [out[m]] = ir_measures.pytrec_eval.calc_aggregate([RR], judged, cut).values()
    return out


def test_ids_are_one_field_and_stay_distinct():
    assert trec_id("test/edu/debate/pro01/counter") == "test/edu/debate/pro01/counter"
    assert trec_id("a b\tc%d") == "a%20b%09c%25d"
    assert trec_id("a%20b") != trec_id("a b")  # '%' itself is escaped, so no two names meet
    assert trec_id("pairs.jsonl:line 3") == "pairs.jsonl:line%203"


def test_the_run_lists_each_ranking_best_first_with_strictly_falling_scores():
    """The score of place p is 101 - p: a tool that sorts by score (trec_eval: score descending, then document id)
    keeps the ranking's order, ties included (a candidate tied with the true counter is already placed above it)."""
    docs = ["d0", "d1", "d2", "d3"]
    rows = np.array([[2, 0, 1], [3, NONE, NONE]])
    assert run_text(["q0", "q1"], docs, rows, "tag") == (
        "q0 Q0 d2 1 100 tag\nq0 Q0 d0 2 99 tag\nq0 Q0 d1 3 98 tag\nq1 Q0 d3 1 100 tag\n"
    )
    deep = np.tile(np.arange(4), (1, 30))[:, :120]  # only the first 100 places are written
    assert run_text(["q"], [f"d{i}" for i in range(4)], deep, "t").count("\n") == 100
    assert qrels_text(["q0", "q1"], docs, np.array([[1, 3], [2, 0]]), np.array([[1, 2], [1, 0]])) == (
        "q0 0 d1 1\nq0 0 d3 2\nq1 0 d2 1\n"
    )


def test_a_library_reads_a_hand_made_ranking_as_the_metrics_do():
    """Three queries of 5 documents: graded relevance, a relevant document the run does not list, one past 10."""
    docs = [f"d{i}" for i in range(15)]
    rows = np.array(
        [list(range(0, 12)), [12, 13, 14, 0, 1, 2, 3, 4, 5, 6, 7, 8], [5, 4, 3, 2, 1, 0, 6, 7, 8, 9, 10, 11]]
    )
    relevant, grade = (
        np.array([[1, 0, 14], [11, NONE, NONE], [0, 11, NONE]]),
        np.array([[2, 1, 1], [1, 0, 0], [3, 1, 0]]),
    )
    # places of the relevant documents in each ranking (NOT_LISTED when absent)
    places = np.stack([listed_ranks(rows, relevant[:, j]) for j in range(3)], axis=1)
    ranks = Ranks(np.where(grade > 0, places, 0), 100, grade)
    queries = ["q0", "q1", "q2"]
    run_lines = run_text(queries, docs, rows, "t")
    qrels = qrels_text(queries, docs, np.where(grade > 0, relevant, 0), grade)
    lib = library([nDCG @ 10, RR @ 10, R @ 100], qrels, run_lines)
    assert lib[nDCG @ 10] == pytest.approx(ndcg_at(ranks, 10), rel=1e-12)
    assert lib[RR @ 10] == pytest.approx(mrr_at(ranks, 10), rel=1e-12)
    assert lib[R @ 100] == pytest.approx(recall_at(ranks, 100), rel=1e-12)


@pytest.fixture(scope="module")
def trec_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("trec-run")
    final = run(compose_cfg(FAST + ["+variant=ln", "eval.tasks=false"]), out)
    return out, final


@pytest.mark.slow
def test_a_runs_own_figures_are_the_librarys_of_its_files(trec_run):
    """The tiny model's demo run: test.run.gz and test.qrels, read by ir-measures (pytrec_eval, trec_eval's code), give
    the best epoch's test nDCG@10, MRR@10, R@100 of metrics.jsonl, and its top1 (P@1), mrr (RR@k of the reranked
    shortlist: the final ranking's first k places) and recall_at_k (R@k) too."""
    out, final = trec_run
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    best = next(r for r in rows if r["epoch"] == final["best_epoch"] and r["split"] == "test")
    run_lines, qrels = gzip.decompress((out / RUN_FILE).read_bytes()).decode(), (out / QRELS_FILE).read_text()
    k = best["k"]
    measures = [nDCG @ 10, RR @ 10, R @ 100, P @ 1, RR @ k, R @ k]
    lib = library(measures, qrels, run_lines)
    ours = [best[key] for key in ("ndcg_at_10", "mrr_at_10", "recall_at_100", "top1", "mrr", "recall_at_k")]
    assert [lib[m] for m in measures] == pytest.approx(ours, rel=1e-12, abs=1e-15)
    # every test query is in both files, with its one true counter
    assert len({line.split()[0] for line in run_lines.splitlines()}) == best["queries"]
    assert len(qrels.splitlines()) == best["queries"]
    assert 0 < best["ndcg_at_10"] < 1  # a figure a library could disagree with (not every query first)
    # the gzipped run as a user hands it to ir-measures (by its path) reads as the same lines
    assert list(ir_measures.read_trec_run(str(out / RUN_FILE))) == list(ir_measures.read_trec_run(run_lines))


@pytest.mark.slow
def test_the_selection_metric_can_be_the_val_ndcg(tmp_path):
    """eval.select=ndcg_at_10 (a BEIR run's choice): final.json records it, and the best epoch is the one of the
    highest val nDCG@10 (the first of equals)."""
    out = tmp_path / "run"
    final = run(
        compose_cfg(FAST + ["+variant=ln", "eval.tasks=false", "trainer.max_epochs=3", "eval.select=ndcg_at_10"]), out
    )
    assert final["selection"] == {"split": "val", "metric": "ndcg_at_10"}
    val = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    val = [r["ndcg_at_10"] for r in val if r["split"] == "val"]
    assert final["best_epoch"] == int(np.argmax(val))
