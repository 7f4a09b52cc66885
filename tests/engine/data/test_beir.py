"""data=beir: the BEIR reader (several relevant documents per query, graded; the corpus as candidates; an absent
split), its bad files refused in one line, mining that never draws a relevant document, the shipped example, and the
demo through both layouts giving the same numbers where the protocols coincide (data.pool=positives)."""

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from biencoder.engine.config.packaged import beir_demo
from biencoder.engine.data.beir import BeirError, read_beir
from biencoder.engine.data.beir_export import export_beir
from biencoder.engine.data.corpus import run_splits
from biencoder.engine.data.paired import seen_queries
from biencoder.engine.retrieval.metrics import judged_ranks, ndcg_at
from biencoder.engine.retrieval.negatives import mine_negatives
from biencoder.engine.retrieval.official_tasks import baseline_ranks
from biencoder.engine.retrieval.rerank import pool_mask
from biencoder.engine.runs.trec import ranking_files
from biencoder.engine.training.triplets import triplet_rows
from conftest import compose_cfg
from helpers import beir_folder, finished_folders

SYNTHETIC_CORPUS = [
    {"_id": "d1", "title": "Tides", "text": "The moon pulls the sea."},
    {"_id": "d2", "title": "", "text": "Gravity of the moon makes tides."},
    {"_id": "d3", "title": "", "text": "Bread rises with yeast."},
    {"_id": "d4", "title": "", "text": "Yeast eats sugar and makes gas."},
    {"_id": "d5", "title": "", "text": "Trains run on rails."},
    {"_id": "q1", "title": "", "text": "why are there tides"},
]
SYNTHETIC_QUERIES = [
    {"_id": "q1", "text": "why are there tides"},
    {"_id": "q2", "text": "how does bread rise"},
    {"_id": "q3", "text": "what do trains run on"},
    {"_id": "q4", "text": "why are there tides"},
]


def write_beir(folder: Path, corpus=None, queries=None, qrels=None) -> Path:
    """A small synthetic BEIR folder; ``qrels``: split file name -> lines after the header (None: leave it out)."""
    qrels = (
        {
            "train.tsv": ["q1\td1\t2", "q1\td2\t1", "q2\td3\t1", "q2\td5\t0"],
            "dev.tsv": ["q2\td4\t1", "q3\td5\t1"],
            "test.tsv": ["q4\td2\t1", "q3\td5\t1"],
        }
        if qrels is None
        else qrels
    )
    return beir_folder(folder, corpus or SYNTHETIC_CORPUS, queries or SYNTHETIC_QUERIES, qrels)


def test_judgements_several_relevant_graded_and_the_corpus_as_candidates(tmp_path):
    beir = read_beir(write_beir(tmp_path / "b"))
    train = beir.paired("train", "all")
    assert train.n_pairs == 2 and len(train.table) == 2 + len(SYNTHETIC_CORPUS)
    pair, row, grade = train.relevant_pairs
    ids = train.table["pair_id"].to_numpy()
    # q1: d1 (grade 2) then d2 (grade 1); q2: d3 only (d5's score 0 is not relevant)
    assert [(ids[p], ids[r], g) for p, r, g in zip(pair, row, grade, strict=True)] == [
        ("q1", "d1", 2),
        ("q1", "d2", 1),
        ("q2", "d3", 1),
    ]
    assert train.qrels == {0: {2: 2, 3: 1}, 1: {4: 1}}
    assert train.table["text"][2] == "Tides The moon pulls the sea."  # title and text
    # the training triplets: the query with each relevant document
    mined = type("M", (), {"row": np.array([6, 6])})()
    assert triplet_rows(train, mined).tolist() == [[0, 2, 6], [0, 3, 6], [1, 4, 6]]
    # candidates: documents only, never the query's own (q1's _id is a document) nor a query row
    rows = np.broadcast_to(np.arange(len(train.table)), (2, len(train.table)))
    cand = train.is_candidate(rows)
    assert not cand[:, :2].any() and not cand[0, ids.tolist().index("q1", 2)] and cand[1, 7]
    assert cand[0, [2, 3, 4, 5, 6]].all()
    # a second relevant document never counts against the first
    assert not pool_mask(train, np.arange(2))[0, 3]
    positives = beir.paired("train", "positives")
    assert positives.table["pair_id"].tolist() == ["q1", "q2", "d1", "d2", "d3"]
    # seen: a test query whose text is a training or dev query's (q4 asks what q1 asks; q3 is a dev query)
    test = beir.paired("test", "all")
    assert seen_queries(test, [train, beir.paired("val", "all")]).tolist() == [True, True]


def test_a_query_is_judged_by_every_relevant_document_with_its_grade(tmp_path):
    """The final ranking's metrics and the qrels file read each relevant document with its grade: q1 has d1 (2) and d2
    (1), q2 has d3 (1); nDCG@10 by hand from planted rankings."""
    train = read_beir(write_beir(tmp_path / "b")).paired("train", "all")
    relevant, grade = train.judgements()
    ids = train.table["pair_id"].to_numpy()
    assert [[ids[r] for r, g in zip(rr, gg, strict=True) if g] for rr, gg in zip(relevant, grade, strict=True)] == [
        ["d1", "d2"],
        ["d3"],
    ]
    assert grade.tolist() == [[2, 1], [1, 0]]
    row = {name: i for i, name in enumerate(ids) if i >= train.n_pairs}
    # q1's ranking: d2, d3, d1; q2's: d1, d2, d3, d4
    final = np.array([[row["d2"], row["d3"], row["d1"], -1], [row["d1"], row["d2"], row["d3"], row["d4"]]])
    ranks = judged_ranks(final, relevant, grade, 100)
    assert ranks.rank.tolist() == [[3, 1], [3, 0]]
    q1 = (2 / math.log2(4) + 1 / math.log2(2)) / (2 / math.log2(2) + 1 / math.log2(3))
    assert ndcg_at(ranks, 10) == pytest.approx((q1 + 1 / math.log2(4)) / 2)
    qrels = ranking_files(train, None, final, "t")["test.qrels"]
    assert qrels.splitlines() == ["q1 0 d1/document 2", "q1 0 d2/document 1", "q2 0 d3/document 1"]


def test_a_split_without_qrels_is_absent_and_named_when_a_run_needs_it(tmp_path):
    beir = read_beir(write_beir(tmp_path / "b", qrels={"train.tsv": ["q1\td1\t1"], "test.tsv": ["q3\td5\t1"]}))
    assert set(beir.counts) == {"train", "test"} and "val->test" not in beir.overlap()
    with pytest.raises(BeirError, match=r"qrels/dev.tsv' is missing, so the BEIR folder has no val split"):
        beir.paired("val")


def test_dedup_drops_the_queries_a_later_split_asks(tmp_path):
    beir = read_beir(write_beir(tmp_path / "b")).deduplicated()
    # train's q1 asks what test's q4 asks, its q2 is a dev query; dev's q3 is a test query
    assert beir.dropped == {"train": 2, "val": 1, "test": 0}
    assert beir.paired("val").table["pair_id"][:1].tolist() == ["q2"]
    with pytest.raises(BeirError, match="train.tsv' judges no document .* once data.dedup dropped"):
        beir.paired("train")


BAD = [
    ("no _id", {"corpus": [{"title": "", "text": "x"}]}, ["corpus.jsonl' line 1", 'has no "_id"']),
    (
        "duplicate _id",
        {"corpus": SYNTHETIC_CORPUS + [{"_id": "d1", "text": "again"}]},
        ["corpus.jsonl' line 7", "'d1' is also line 1", 'its own "_id"'],
    ),
    ("empty corpus", {"corpus": [""]}, ["corpus.jsonl' holds no document"]),
    ("not JSON", {"queries": ["{oops"]}, ["queries.jsonl' line 1 is not JSON", "one JSON object per line"]),
    (
        "unknown document",
        {"qrels": {"train.tsv": ["q1\tnowhere\t1"], "dev.tsv": [], "test.tsv": []}},
        ["train.tsv' line 2", "corpus-id 'nowhere' is not in", "add it there, or drop the line"],
    ),
    (
        "unknown query",
        {"qrels": {"train.tsv": ["q1\td1\t1"], "dev.tsv": ["q9\td1\t1"], "test.tsv": []}},
        ["dev.tsv' line 2", "query-id 'q9' is not in"],
    ),
    (
        "bad score",
        {"qrels": {"train.tsv": ["q1\td1\thigh"], "dev.tsv": [], "test.tsv": []}},
        ["train.tsv' line 2", "score 'high' is not an integer"],
    ),
    (
        "judged twice",
        {"qrels": {"train.tsv": ["q1\td1\t1", "q1\td1\t2"], "dev.tsv": [], "test.tsv": []}},
        ["train.tsv' line 3", "also judged on line 2", "keep one line per pair"],
    ),
    ("no qrels", {"qrels": {}}, ["holds none of train.tsv, dev.tsv, test.tsv"]),
]


@pytest.mark.parametrize("given, expect", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_a_bad_file_is_one_line_naming_the_file_the_line_and_the_fix(tmp_path, given, expect):
    folder = write_beir(tmp_path / "b", **given)
    with pytest.raises(BeirError) as err:
        read_beir(folder)
    message = str(err.value)
    assert "\n" not in message
    for text in expect:
        assert text in message, message


def test_mining_never_draws_a_relevant_document(tmp_path):
    """Planted: q1's two relevant documents and a copy of one are its nearest; every other document is farther."""
    corpus = SYNTHETIC_CORPUS[:5] + [{"_id": "copy", "title": "", "text": "Gravity of the moon makes tides."}]
    folder = write_beir(tmp_path / "b", corpus=corpus, qrels={"train.tsv": ["q1\td1\t2", "q1\td2\t1", "q2\td3\t1"]})
    split = read_beir(folder).paired("train", "all")
    sim = np.zeros((len(split.table), 2))
    sim[:, 0] = np.arange(len(split.table)) * 10.0  # far apart ...
    sim[[2, 3, 7], 0] = [0.1, 0.2, 0.15]  # ... but q1's relevant documents and the copy sit on q1 (row 0)
    sim[6, 0] = 5.0  # d5: q1's nearest allowed document
    hard = mine_negatives(sim, split, 0.0, np.random.default_rng(0))
    assert hard.row[0] == 6
    for seed in range(20):
        random = mine_negatives(sim, split, 1.0, np.random.default_rng(seed))
        assert not split.is_relevant(random.row[:, None]).any()
        assert (random.row >= split.n_pairs).all()  # documents only, never a query
        assert random.row[0] not in (2, 3, 7)  # nor a copy of a relevant one


def test_the_shipped_example_is_export_beir_of_the_demo(demo_corpus, tmp_path):
    written = export_beir(demo_corpus, tmp_path / "b")
    for path in written.values():
        shipped = beir_demo() / path.relative_to(tmp_path / "b")
        assert shipped.read_bytes() == path.read_bytes(), path
    with pytest.raises(BeirError, match="exists: export into a new or empty folder"):
        export_beir(demo_corpus, tmp_path / "b")


@pytest.mark.slow
def test_the_demo_through_both_layouts_gives_the_same_numbers_where_the_protocols_coincide():
    """data.pool=positives (the candidates: the split's counters, the documents judged in the split): the same
    queries, candidates, relevance and training pairs, so the same baselines' ranks (zero-shot cosine of fixed vectors,
    TF-IDF). (pool=all differs by design: BEIR's candidates are the whole corpus, ArguAna's the split's arguments.)"""
    cfg = {"dedup": False, "pool": "positives"}
    _, demo = run_splits(dict(compose_cfg(["data=demo"]).data) | cfg)
    _, beir = run_splits(dict(compose_cfg(["data=beir_demo"]).data) | cfg)
    negatives = type("M", (), {})()
    for name in ("train", "val", "test"):
        a, b = demo[name], beir[name]
        assert a.texts == b.texts and (a.text_id == b.text_id).all() and (a.counter == b.counter).all()
        assert (pool_mask(a, np.arange(a.n_pairs)) == pool_mask(b, np.arange(b.n_pairs))).all()
        negatives.row = np.zeros(a.n_pairs, dtype=np.int64)
        assert (triplet_rows(a, negatives) == triplet_rows(b, negatives)).all()
        pooled = torch.from_numpy(np.random.default_rng(0).normal(size=(len(a.texts), 16)))
        ranks_a, ranks_b = baseline_ranks(a, pooled), baseline_ranks(b, pooled)
        for score in ("encoder_cosine", "tfidf"):
            assert (ranks_a[score] == ranks_b[score]).all(), (name, score)
    test_top1 = (baseline_ranks(demo["test"], pooled)["tfidf"] == 1).mean()
    assert test_top1 == (baseline_ranks(beir["test"], pooled)["tfidf"] == 1).mean() > 0


@pytest.mark.slow
def test_train_on_a_bad_folder_exits_in_one_line_and_leaves_no_run_folder(tmp_path):
    folder = write_beir(tmp_path / "b", qrels={"train.tsv": ["q1\tnowhere\t1"], "dev.tsv": [], "test.tsv": []})
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    logs = tmp_path / "logs"
    proc = subprocess.run(
        [sys.executable, "-m", "biencoder.train", "model=tiny", "trainer.progress=false", "trainer.max_epochs=1"]
        + ["data=beir", f"data.root={folder}", f"paths.log_dir={logs}"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "train.tsv' line 2: corpus-id 'nowhere'" in errors[0], proc.stderr
    assert finished_folders(tmp_path) == []
    assert not (logs / "runs").exists() or list((logs / "runs").iterdir()) == []
