"""The MTEB protocol (``eval.protocol=mteb``, :mod:`biencoder.engine.retrieval.mteb`): queries and candidates read from
a corpus written by hand, ranks and metrics counted by hand from planted scores, the evaluate app's record, and the
real corpus's counts."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

from biencoder.engine.data.corpus import read_corpus
from biencoder.engine.modeling.model import Embeddings
from biencoder.engine.retrieval.metrics import Ranks
from biencoder.engine.retrieval.mteb import (
    CorpusQueries,
    corpus_queries,
    per_query,
    protocol_metrics,
    protocol_ranks,
)
from biencoder.engine.retrieval.rerank import Rerank
from helpers import candidate_scorer

#: a corpus of three splits: a test point whose text is also a training point's (a duplicate of the query text
#: elsewhere in the corpus), a test counter whose text is also a validation counter's, and a point without a
#: counter in training and in test (candidates, never queries). Folders read con/ before pro/.
LAYOUT = {
    "training": {"tA": {"d1": {"con": [("an unpaired point", None)], "pro": [("apples grow", "trees need water")]}}},
    "validation": {"tA": {"d2": {"pro": [("rivers flow", "seas rise")]}}},
    "test": {
        "tB": {
            "d3": {
                "con": [("a test point alone", None)],
                "pro": [("apples grow", "apples fall in autumn"), ("rivers flow", "seas rise")],
            }
        }
    },
}
#: the distinct texts in file order (training, validation, test): the candidates' rows
ROWS = [
    "an unpaired point",
    "apples grow",
    "trees need water",
    "rivers flow",
    "seas rise",
    "a test point alone",
    "apples fall in autumn",
]


def test_queries_and_candidates_of_a_corpus_by_hand(make_corpus):
    queries = corpus_queries(read_corpus(make_corpus(LAYOUT)), "test", None)
    assert queries.texts == ROWS  # every distinct text of every split, the unpaired points too
    assert queries.n_pairs == 2 and queries.query_ids == ("tB/d3/pro01", "tB/d3/pro02")
    assert queries.query.tolist() == [1, 3]  # the test points' texts are training's and validation's rows
    assert queries.counter.tolist() == [6, 4]
    # the query's own text is no candidate, wherever else it occurs (one row per text), nor is the relevant document
    # a false candidate; every other text is one, the other query's text and the unpaired points included
    mask = queries.false_candidates(np.arange(2))
    assert [np.flatnonzero(~m).tolist() for m in mask] == [[1, 6], [3, 4]]
    val = corpus_queries(read_corpus(make_corpus(LAYOUT, "again")), "validation", None)
    assert val.query.tolist() == [3] and val.counter.tolist() == [4] and len(val.table) == 7


def test_a_counter_with_its_points_text_is_refused(make_corpus):
    layout = json.loads(json.dumps(LAYOUT))
    layout["test"]["tB"]["d3"]["pro"][0] = ["same text", "same text"]
    with pytest.raises(ValueError, match="1 point\\(s\\) of test have their counter's text, e.g. tB/d3/pro01"):
        corpus_queries(read_corpus(make_corpus(layout)), "test", None)


def line_queries(n: int, own: list[int], relevant: list[int]) -> CorpusQueries:
    """``n`` candidates t0 ... t<n-1>; query i's own text is row ``own[i]``, its counter row ``relevant[i]``."""
    table = pd.DataFrame({"text": [f"t{r}" for r in range(n)]})
    ids = tuple(f"q{i}" for i in range(len(own)))
    return CorpusQueries("test", table, np.array(own), np.array(relevant), ids)


@pytest.fixture
def line(tiny_model_and_tokenizer):
    """120 candidates on a line (row r at sim[:, 0] = r) and four queries; the classifier's margin for (query,
    candidate) is the candidate's pooled[0] (0 unless planted)."""
    queries = line_queries(120, own=[0, 50, 2, 100], relevant=[1, 53, 119, 111])
    sim, pooled = torch.zeros(120, 128), torch.zeros(120, 32)
    sim[:, 0] = torch.arange(120, dtype=torch.float32)
    return queries, Embeddings(sim, pooled), candidate_scorer(tiny_model_and_tokenizer[0])


def test_ranks_and_metrics_by_hand(line):
    queries, emb, _ = line
    ranks = protocol_ranks(queries, "sim", emb=emb)
    # q0 at 0: its own text (distance 0) is no candidate, so its counter (distance 1) is first
    # q1 at 50, counter 53 at distance 3: 49, 51, 48, 52 are nearer and 47 ties it (a tie counts against) -> 6
    # q2 at 2, counter 119 at distance 117: every other candidate is as near or nearer (0, 1, 3 ... 118) -> 119
    # q3 at 100, counter 111 at distance 11: 89 ... 99 and 101 ... 110 -> 22
    assert ranks.rank.tolist() == [1, 6, 119, 22] and ranks.depth is None
    got = protocol_metrics(ranks)
    assert got["ndcg_at_10"] == pytest.approx((1 + 1 / math.log2(7)) / 4)
    assert got["mrr_at_10"] == pytest.approx((1 + 1 / 6) / 4)  # 22 and 119 are past the 10th place
    assert got["recall_at_100"] == pytest.approx(3 / 4)  # 119 is past the 100th
    assert got["accuracy_at_1"] == pytest.approx(1 / 4)
    assert got["mrr"] == pytest.approx((1 + 1 / 6 + 1 / 119 + 1 / 22) / 4)
    assert got["queries"] == 4
    ndcg = per_query(ranks, "ndcg_at_10")
    assert ndcg.tolist() == pytest.approx([1, 1 / math.log2(7), 0, 0]) and ndcg.mean() == pytest.approx(
        got["ndcg_at_10"]
    )


def test_a_duplicate_of_the_query_text_would_rank_first_were_it_not_excluded(line):
    """The same vectors with q0's own row a false candidate: it ranks first and pushes the counter to 2."""
    queries, emb, _ = line
    kept = protocol_ranks(queries, "sim", emb=emb)
    own = np.array([5, 50, 2, 100])
    with_own = CorpusQueries(queries.name, queries.table, own, queries.counter, queries.query_ids)
    emb.sim[5, 0] = 0.0  # row 5 now has q0's vector: a second copy of the query text, a false candidate
    assert protocol_ranks(with_own, "sim", emb=emb).rank.tolist() == [2, 6, 119, 22]
    assert kept.rank[0] == 1


def test_the_runs_final_ranking_by_hand(line):
    """``rerank``: the k nearest by sim distance reordered by the classifier's margin, then the rest by distance."""
    queries, emb, model = line
    emb.pooled[[1, 2], 0] = 1.0  # q0's shortlist (k=3) is 1, 2, 3; 2 ties its counter 1 on the margin
    emb.pooled[52, 0] = 2.0
    ranks = protocol_ranks(queries, "rerank", model, emb, Rerank(k=3))
    # q0: 2 ties 1 -> 2; q1: shortlist 49, 51, 48 (equal distances: the lower row first) without 53 -> after the 3,
    # then 52 and 47 (distance <= 3) ahead -> 6; q2, q3: not shortlisted, as by distance
    assert ranks.rank.tolist() == [2, 6, 119, 22]
    emb.pooled[1, 0] = 3.0
    assert protocol_ranks(queries, "rerank", model, emb, Rerank(k=3)).rank[0] == 1


def test_cosine_and_tfidf_rank_every_candidate(make_corpus):
    queries = corpus_queries(read_corpus(make_corpus(LAYOUT)), "test", None)
    pooled = torch.eye(7)  # every text orthogonal to every other: all candidates tie at cosine 0
    ranks = protocol_ranks(queries, "encoder_cosine", emb=Embeddings(pooled, pooled))
    assert ranks.rank.tolist() == [6, 6]  # 7 texts less the query's own: its counter after the 5 it ties
    tfidf = protocol_ranks(queries, "tfidf")
    # "rivers flow" shares no word with any candidate: every score is 0, its counter last of 6 again; "apples grow"
    # shares "apples" with its counter alone (its own text, the training point's too, is no candidate)
    assert tfidf.rank.tolist() == [1, 6]


@pytest.mark.slow
def test_the_evaluate_app_records_the_protocol(tmp_path):
    from biencoder.engine.config.packaged import demo_root
    from biencoder.engine.inference.evaluation import run_evaluation
    from conftest import compose_cfg

    cfg = compose_cfg(
        ["eval.protocol=mteb", "eval.score=tfidf", "trainer.progress=false"],
        config_name="evaluate",
    )
    result = run_evaluation(cfg, tmp_path)
    saved = json.loads((tmp_path / "eval.json").read_text())
    assert saved["protocol"] == "mteb" and "tasks" not in saved and saved["mteb"] == result["mteb"]
    assert "query_ids" not in saved["mteb"]  # the pair ids are folder names of the corpus: not written
    got = saved["mteb"]
    corpus = read_corpus(demo_root())
    assert got["queries"] == len(got["ranks"]) == corpus.counts["test"]["pairs"]
    assert got["candidates"] == corpus.arguments["text"].nunique()
    ranks = Ranks(np.array(got["ranks"]))
    assert protocol_metrics(ranks) == {k: got[k] for k in protocol_metrics(ranks)}
    assert got["ndcg_at_10"] == pytest.approx(per_query(ranks, "ndcg_at_10").mean())


def test_a_protocol_that_does_not_exist_is_refused():
    from biencoder.engine.config.validation import validate
    from biencoder.errors import ConfigError
    from conftest import compose_cfg

    with pytest.raises(ConfigError, match="eval.protocol='beir' is not valid: use one of tasks, mteb"):
        validate(compose_cfg(["eval.protocol=beir"], config_name="evaluate"))


def test_real_corpus_queries_and_candidates(real_corpus):
    """MTEB's ArguAna has 1406 queries and 8674 documents; this corpus's test split has 1406 points, 1401 with a
    counter (the queries), and 8567 distinct argument texts in its three splits (docs/protocol.md says why they
    differ)."""
    queries = corpus_queries(real_corpus, "test", None)
    assert queries.n_pairs == 1401 and len(queries.table) == 8567
    assert real_corpus.counts["test"]["points"] == 1406
    assert len(set(queries.query.tolist())) == 1294  # test points whose text another test point repeats share a row
