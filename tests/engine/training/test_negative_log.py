"""negatives.log=true: every epoch's mined negatives in the run folder, what ``biencoder-corpus negatives`` makes of
them, and that the log changes no number of the run."""

import json

import numpy as np
import pytest

from biencoder.corpus import main as corpus_main
from biencoder.engine.retrieval.negative_record import RECORD_FIELDS
from biencoder.engine.training.epoch import EpochTrainer
from biencoder.engine.training.run import run
from conftest import FAST, compose_cfg

RULE = ["negatives.rank_range=[2,6]", "negatives.random_rate.start=0.5"]
VOLATILE = {"epoch_time_s"}


def numbers(path):
    return [{k: v for k, v in json.loads(line).items() if k not in VOLATILE} for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_the_log_holds_what_was_mined_and_changes_no_number(tmp_path, monkeypatch, capsys):
    mined = []
    real_mine = EpochTrainer.mine

    def mine(self, epoch, emb):
        negatives = real_mine(self, epoch, emb)
        mined.append(negatives)
        return negatives

    monkeypatch.setattr(EpochTrainer, "mine", mine)
    logged = tmp_path / "logged"
    run(compose_cfg(FAST + RULE + ["negatives.log=true"]), logged)
    files = sorted((logged / "negatives").iterdir())
    assert [f.name for f in files] == ["epoch_000.npz", "epoch_001.npz"]
    for file, negatives in zip(files, mined, strict=True):
        with np.load(file) as record:
            assert set(RECORD_FIELDS) | {"rate"} == set(record.files)
            np.testing.assert_array_equal(record["row"], negatives.row)  # what the epoch trained on
            np.testing.assert_array_equal(record["is_random"], negatives.is_random)
            np.testing.assert_array_equal(record["distance"], negatives.distance)
            hard = ~record["is_random"]
            assert (record["rank"][hard] >= 2).all() and (record["rank"] >= 1).all()
            assert float(record["rate"]) == negatives.rate
    plain = tmp_path / "plain"
    run(compose_cfg(FAST + RULE), plain)
    assert not (plain / "negatives").exists()
    assert numbers(plain / "metrics.jsonl") == numbers(logged / "metrics.jsonl")

    capsys.readouterr()
    assert corpus_main(["negatives", str(logged), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [row["epoch"] for row in rows] == [0, 1]
    assert rows[0]["rate"] == 0.5 and np.isnan(rows[0]["share_same_as_previous"] or np.nan)
    assert 0 <= rows[1]["share_positive_of_other"] <= 1 and rows[1]["median_rank_hard"] >= 2
    assert corpus_main(["negatives", str(logged)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[1].split()[:4] == ["epoch", "random_rate", "hard", "pos_of_other"]
    assert [line.split()[0] for line in table[2:]] == ["0", "1"]


def test_a_run_without_the_log_is_told_how_to_get_one(tmp_path, capsys):
    assert corpus_main(["negatives", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"error: {tmp_path} holds no negatives/epoch_*.npz: run the training with negatives.log=true to "
        "record what each epoch mined"
    ]
