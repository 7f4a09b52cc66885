"""scripts/bench_scale.py: the scale benchmark of docs/scaling-data.md and BENCHMARKS item 7, its BEIR form (issue
50: a 100k-document corpus) made by hand-checkable rules, and one small size run through the runner as the script
runs it (so that a change of the runner's API cannot leave the script broken unnoticed)."""

import json
import runpy
import sys

import numpy as np
import pytest

from biencoder.engine.data.corpus import run_splits
from conftest import REPO

SCRIPT = runpy.run_path(str(REPO / "scripts" / "bench_scale.py"))


def write_pairs(folder, splits):
    folder.mkdir()
    for name, rows in splits.items():
        text = "".join(json.dumps({"anchor": a, "positive": p, "group": "g0"}) + "\n" for a, p in rows)
        (folder / f"{name}.jsonl").write_text(text)


def test_the_beir_form_of_pair_files(tmp_path):
    """Every distinct positive one document (a shared one once), the first TRAIN / VAL / TEST anchors of each split
    the queries, each judged relevant to its own positive: what data=beir then reads."""
    splits = {
        "train": [("tq one", "doc one"), ("tq two", "doc two"), ("tq three", "doc three")],
        "val": [("vq one", "doc four"), ("vq two", "doc five")],
        "test": [("sq one", "doc two"), ("sq two", "doc six")],  # a positive train shares: one document
    }
    write_pairs(tmp_path / "pairs", splits)
    folder = SCRIPT["synthetic_beir"](tmp_path / "pairs", [2, 1, 2])
    corpus = [json.loads(line) for line in (folder / "corpus.jsonl").read_text().splitlines()]
    assert [d["text"] for d in corpus] == ["doc one", "doc two", "doc three", "doc four", "doc five", "doc six"]
    queries = [json.loads(line)["text"] for line in (folder / "queries.jsonl").read_text().splitlines()]
    assert queries == ["tq one", "tq two", "vq one", "sq one", "sq two"]
    doc = {d["_id"]: d["text"] for d in corpus}
    test = (folder / "qrels" / "test.tsv").read_text().splitlines()
    assert test[0] == "query-id\tcorpus-id\tscore"
    assert [doc[line.split("\t")[1]] for line in test[1:]] == ["doc two", "doc six"]
    _, read = run_splits({"layout": "beir", "root": str(folder), "dedup": False, "pool": "all"})
    assert {n: s.n_pairs for n, s in read.items()} == {"train": 2, "val": 1, "test": 2}
    assert len(read["test"].pool_rows) == 6  # the whole corpus is every split's candidates
    texts = read["test"].table["text"].to_numpy()
    assert list(texts[read["test"].counter]) == ["doc two", "doc six"]
    assert np.array_equal(read["train"].counter, read["train"].relevance[1])  # one relevant document a query


@pytest.mark.slow
def test_one_beir_size_runs_through_the_runner(tmp_path, capsys):
    """``--one``: the process the script starts per size, here with a small BEIR corpus, says its phases, peaks and
    documents in its RESULT line."""
    import torch

    threads = torch.get_num_threads()
    try:
        argv = ["--one", "400", "--epochs", "1", "--threads", "1", "--beir", "40", "10", "10"]
        argv += ["--data-dir", str(tmp_path / "data"), "--cache-dir", str(tmp_path / "cache")]
        assert SCRIPT["main"](argv) == 0
    finally:
        torch.set_num_threads(threads)
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("RESULT "))
    result = json.loads(line[len("RESULT ") :])
    assert result["split_pairs"] == {"train": 40, "val": 10, "test": 10}
    assert 390 <= result["documents"] <= 400  # the distinct positives of 400 pairs (a few shared)
    assert {"mine", "train", "retrieve+rerank test", "epoch"} <= set(result["phases"]["wall"])
    assert result["overall_peak_mb"] > 0 or sys.platform != "linux"
