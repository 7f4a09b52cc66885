"""The MTEB protocol's table (:mod:`biencoder.report.mteb`, ``scripts/mteb_table.py``) from records written by hand."""

from __future__ import annotations

import json
import math

import pytest

from biencoder.report import SummaryError
from biencoder.report.mteb import mteb_markdown, mteb_rows, read_records


def write(folder, name: str, ranks: list[int], protocol: str = "mteb") -> None:
    record = {"protocol": protocol, "mteb": {"queries": len(ranks), "candidates": 200, "ranks": ranks}}
    (folder / f"{name}.json").write_text(json.dumps(record))


def test_the_table_by_hand(tmp_path):
    write(tmp_path, "zero_shot", [1, 2, 11, 150])
    write(tmp_path, "tfidf", [1, 1, 1, 1])
    for seed in range(3):
        write(tmp_path, f"plain_seed{seed}", [1, 1, 11, 150])  # better than zero-shot on one query in every seed
    baselines, cells = read_records(tmp_path)
    assert set(baselines) == {"zero_shot", "tfidf"} and set(cells) == {"plain"} and set(cells["plain"]) == {0, 1, 2}
    rows, comparisons = mteb_rows(baselines, cells, n_boot=2000)
    by_name = {r["name"]: r for r in rows}
    zero = by_name["zero-shot MiniLM (cosine)"]
    assert zero["ci"]["ndcg_at_10"][0] == pytest.approx((1 + 1 / math.log2(3)) / 4)
    assert zero["ci"]["mrr_at_10"][0] == pytest.approx(1.5 / 4)
    assert zero["ci"]["recall_at_100"][0] == pytest.approx(3 / 4)
    assert by_name["TF-IDF"]["ci"]["ndcg_at_10"] == (1.0, 1.0, 1.0)
    assert by_name["plain"]["seeds"] == [0, 1, 2] and by_name["plain"]["queries"] == 4
    [plain] = comparisons
    assert plain["diff"] == pytest.approx((1 - 1 / math.log2(3)) / 4) and plain["seeds"] == 3
    assert plain["p_holm"] == plain["p"]  # a family of one
    text = mteb_markdown(rows, comparisons, 2000)
    assert "| plain | 3 (0, 1, 2) | 4 | 200 |" in text and "p (Holm, 1)" in text


def test_records_that_do_not_belong_are_refused(tmp_path):
    write(tmp_path, "zero_shot", [1, 2])
    write(tmp_path, "relu_seed0", [1, 2, 3])
    with pytest.raises(SummaryError, match="different numbers of queries"):
        read_records(tmp_path)
    (tmp_path / "relu_seed0.json").unlink()
    write(tmp_path, "mine", [1, 2])
    with pytest.raises(SummaryError, match="name it zero_shot.json, tfidf.json or <cell>_seed<N>.json"):
        read_records(tmp_path)
    (tmp_path / "mine.json").unlink()
    write(tmp_path, "tfidf", [1, 2], protocol="tasks")
    with pytest.raises(SummaryError, match="not an evaluation record of eval.protocol=mteb"):
        read_records(tmp_path)
