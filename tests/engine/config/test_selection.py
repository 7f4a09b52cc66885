"""The metric that picks a run's best epoch (biencoder.engine.config.selection): the one the run's numbers come from,
recorded in final.json, named in the summary, and the one every table and figure reads back."""

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from biencoder.engine.config.selection import selection
from biencoder.engine.runs.best import BestEpoch
from biencoder.engine.training.evaluation import Evaluation
from biencoder.engine.training.run import run
from biencoder.report.run_summary import summary_text
from biencoder.report.runs import assign_cells, find_runs
from biencoder.report.stability import run_outcomes
from biencoder.report.tables import summary_table, to_markdown
from biencoder.summary import main
from conftest import FAST, compose_cfg

#: val values planted per epoch: the reranked top-1 peaks at epoch 0, the retrieval top-1 first at epoch 1
PLANTED = {"top1": [0.5, 0.1, 0.2], "retrieval_top1": [0.1, 0.3, 0.3]}


def test_the_rule():
    assert selection(1.0, None, "arguana") == {"split": "val", "metric": "top1"}
    assert selection(0.5, None, "arguana") == {"split": "val", "metric": "top1"}
    assert selection(0.0, None, "arguana") == {"split": "val", "metric": "retrieval_top1"}
    # a BEIR folder is compared by nDCG@10; eval.select, where given, wins everywhere
    assert selection(1.0, None, "beir") == {"split": "val", "metric": "ndcg_at_10"}
    assert selection(0.0, None, "beir") == {"split": "val", "metric": "retrieval_top1"}
    assert selection(1.0, "top1", "beir") == {"split": "val", "metric": "top1"}
    assert selection(1.0, None, "arguana") == selection(1.0, None, "pairs") == {"split": "val", "metric": "top1"}


@pytest.mark.slow
@pytest.mark.parametrize(
    "ce_weight, metric, best, label",
    [
        (0, "retrieval_top1", 1, "val retrieval top-1"),  # the first of the tie at 0.3; the reranked top-1 would say 0
        (1, "top1", 0, "val top-1 (reranked)"),
    ],
)
def test_the_best_epoch_is_picked_by_the_metric_the_run_reports(tmp_path, monkeypatch, ce_weight, metric, best, label):
    """With planted val values whose best epochs differ, ``loss.ce_weight=0`` picks by val retrieval top-1 and the
    default by the reranked top-1; final.json records it, test_hits.npy holds that metric's hits at that epoch, and
    the summary names it (and says the classifier is untrained)."""
    real = Evaluation.evaluate_split

    def planted(self, name, emb, epoch=-1):
        metrics, hits = real(self, name, emb, epoch)
        if name == "val":
            metrics.update({key: values[epoch] for key, values in PLANTED.items()})
        return metrics, hits

    monkeypatch.setattr(Evaluation, "evaluate_split", planted)
    out = tmp_path / "run"
    final = run(
        compose_cfg(
            FAST
            + [
                "loss=infonce",
                f"loss.ce_weight={ce_weight}",
                "trainer.max_epochs=3",
                "eval.tasks=false",
                "eval.baselines=false",
            ]
        ),
        out,
    )
    assert json.loads((out / "final.json").read_text())["selection"] == {"split": "val", "metric": metric}
    assert final["best_epoch"] == best and final["best"]["val"][metric] == PLANTED[metric][best]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    test = next(r for r in rows if r["epoch"] == best and r["split"] == "test")
    assert np.load(out / "test_hits.npy").mean() == pytest.approx(test[metric])
    text = summary_text(final, out)
    assert f"best epoch {best} of 0-2, by {label}" in text.splitlines()[0]
    assert ("the pair classifier is not trained" in text) == (ce_weight == 0)


def test_a_resumed_best_from_before_the_field_is_valued_by_this_run_s_metric():
    """A last.pt written before the selection was recorded holds ``val_top1``: it selected by the reranked top-1.
    Resumed by a run that selects by retrieval top-1, its best epoch is kept and valued by its val retrieval top-1
    (the metric later epochs are compared with); by a run that selects by top-1, it is what it was."""
    old = {
        "epoch": 2,
        "val_top1": 0.4,
        "metrics": {"val": {"top1": 0.4, "retrieval_top1": 0.3}},
        "state": None,
        "hits": None,
    }
    for metric, value in (("retrieval_top1", 0.3), ("top1", 0.4)):
        best = BestEpoch.from_saved(dict(old)).valued_by(metric, "last.pt")
        assert (best.epoch, best.metric, best.value) == (2, metric, value) and "val_top1" not in best.saved()


def _write(folder: Path, seed: int, final: dict | None, ce_weight: float = 0.0) -> Path:
    """A finished run folder whose val/test reranked top-1 peak at epoch 0 and retrieval top-1 at epoch 1."""
    (folder / ".hydra").mkdir(parents=True)
    config = {
        "seed": seed,
        "data": {"name": "demo", "root": None},
        "loss": {"name": "infonce", "ce_weight": ce_weight},
        "model": {"name": "tiny", "head": {"use_layernorm": False, "use_relu": False}},
    }
    (folder / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    values = {
        "val": {"top1": [0.5, 0.1, 0.2], "retrieval_top1": [0.1, 0.3, 0.2]},
        "test": {"top1": [0.9, 0.0, 0.0], "retrieval_top1": [0.2, 0.25, 0.1]},
    }
    rows = []
    for epoch in range(3):
        base = {"epoch": epoch, "variant": "plain", "seed": seed, "mrr": 0.0, "recall_at_k": 0.0}
        rows.append({**base, "split": "train", "top1": 0.5, "retrieval_top1": 0.5, "loss": 1.0})
        rows += [
            {**base, "split": split, **{k: v[epoch] for k, v in values[split].items()}} for split in ("val", "test")
        ]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    hits = np.zeros(20, bool)
    hits[:5] = True  # 0.25: test retrieval top-1 at epoch 1
    np.save(folder / "test_hits.npy", hits)
    if final is not None:
        (folder / "final.json").write_text(json.dumps({"status": "done", "variant": "plain", "seed": seed, **final}))
    return folder


@pytest.mark.slow
def test_tables_and_figure_read_each_run_s_selection(tmp_path, capsys):
    """Runs that selected by val retrieval top-1 (final.json) are tabulated at that epoch, whatever metric a table
    shows; a final.json without the field (written before it) selected by the reranked top-1."""
    retrieval = {"selection": {"split": "val", "metric": "retrieval_top1"}, "best_epoch": 1}
    for seed in (0, 1):
        _write(tmp_path / "new" / f"s{seed}", seed, retrieval)
    _write(tmp_path / "old" / "s0", 0, {"best_epoch": 0}, ce_weight=1.0)
    new = find_runs([tmp_path / "new"])
    assign_cells(new)
    shown_top1 = summary_table(new, "top1", n_boot=100).iloc[0]
    # read at epoch 1, the one the runs kept: not the 0.5 of epoch 0, the best val top-1
    assert shown_top1["best_epoch"] == 1 and shown_top1["val_top1_mean"] == pytest.approx(0.1)
    assert shown_top1["selected_by"] == "val retrieval top-1" and np.isnan(shown_top1.get("test_ci_low", np.nan))
    shown = summary_table(new, "retrieval_top1", n_boot=100)
    row = shown.iloc[0]
    assert row["val_retrieval_top1_mean"] == pytest.approx(0.3) and row["test_retrieval_top1_mean"] == pytest.approx(
        0.25
    )
    assert row["test_ci_low"] <= 0.25 <= row["test_ci_high"]  # test_hits.npy holds this metric
    assert "best epoch (from 0) by val retrieval top-1" in to_markdown(shown, shown.iloc[:0], "retrieval_top1")
    outcomes = run_outcomes(new, "seed")
    assert set(outcomes["best_val"]) == {0.3} and set(outcomes["test_at_best"]) == {0.25}
    assert set(outcomes["metric"]) == {"retrieval_top1"}
    old = find_runs([tmp_path / "old"])
    assign_cells(old)
    row = summary_table(old, "top1", n_boot=100).iloc[0]
    assert row["best_epoch"] == 0 and row["val_top1_mean"] == pytest.approx(0.5)
    assert row["selected_by"] == "val top-1 (reranked)"
    # the plot command draws and tabulates the runs' own selection metric unless --metric says otherwise
    assert main([str(tmp_path / "new")]) == 0
    assert (tmp_path / "new" / "retrieval_top1.png").is_file() and not (tmp_path / "new" / "top1.png").exists()
    assert "val retrieval_top1 @ best epoch" in capsys.readouterr().out
