"""The per-cell table and the paired comparisons (biencoder.report.tables) on hand-made runs with known answers."""

import numpy as np
import pytest
import yaml

from biencoder.report import SummaryError
from biencoder.report.runs import assign_cells, find_runs
from biencoder.report.statistics import holm
from biencoder.report.tables import paired_comparisons, summary_table
from helpers import write_run


def test_discovery_grouping_and_aggregation(tmp_path):
    q = 100
    plain_hits = np.zeros(q, bool)
    plain_hits[:20] = True
    ln_hits = np.zeros(q, bool)
    ln_hits[:50] = True  # ln gets 30 more queries right, and loses none
    write_run(
        tmp_path / "sweeps/a/0_plain_s0", "plain", 0, [0.1, 0.3, 0.2], [0.1, 0.2, 0.3], plain_hits, tasks={"sdoc": 0.5}
    )
    write_run(
        tmp_path / "sweeps/a/1_plain_s1", "plain", 1, [0.2, 0.1, 0.4], [0.0, 0.1, 0.2], plain_hits, tasks={"sdoc": 0.7}
    )
    write_run(tmp_path / "sweeps/a/2_ln_s0", "ln", 0, [0.5, 0.5, 0.1], [0.4, 0.9, 0.9], ln_hits)
    write_run(tmp_path / "sweeps/a/3_ln_s1", "ln", 1, [0.1, 0.2, 0.3], [0.1, 0.2, 0.5], ln_hits)
    write_run(tmp_path / "runs/crashed_ln_s2", "ln", 2, [0.9], [0.9], complete=False)
    (tmp_path / "runs/not_a_run").mkdir()
    (tmp_path / "runs/not_a_run/metrics.jsonl").write_text("{}\n")  # no .hydra/config.yaml: ignored

    runs = find_runs([tmp_path])
    assert len(runs) == 5 and sum(r.complete for r in runs) == 4
    assert assign_cells(runs) == []  # only seeds and head flags differ: cells are the variants
    table = summary_table(runs, n_boot=2000).set_index("cell")
    # plain: best val epochs 1 (0.3) and 2 (0.4) → test 0.2 and 0.2; ln: epoch 0 (first of the tie) and 2
    assert table.loc["plain", "val_top1_mean"] == pytest.approx(0.35)
    assert table.loc["plain", "test_top1_mean"] == pytest.approx(0.2) and table.loc[
        "plain", "test_top1_std"
    ] == pytest.approx(0.0)
    assert table.loc["ln", "val_top1_mean"] == pytest.approx(0.4) and table.loc[
        "ln", "test_top1_mean"
    ] == pytest.approx(0.45)
    assert table.loc["ln", "best_epoch"] == pytest.approx(1.0)  # epochs 0 and 2, counted from 0 as everywhere
    assert table.loc["ln", "seeds"] == 2 and table.loc["ln", "incomplete"] == 1  # the crashed run is not averaged in
    assert table.loc["plain", "sdoc_acc1"] == pytest.approx(0.6)
    assert table.loc["plain", "test_ci_low"] < 0.2 < table.loc["plain", "test_ci_high"]

    comparisons = paired_comparisons(runs, n_boot=2000).set_index("cell")
    assert comparisons.loc["ln", "diff_test_top1"] == pytest.approx(0.3)
    assert comparisons.loc["ln", "verdict"] == "better" and comparisons.loc["ln", "pairing"] == "matched"
    assert comparisons.loc["ln", "ci_resamples"] == "queries"  # 2 seeds: no seed-level claim


def test_different_corpora_are_never_averaged(tmp_path):
    write_run(tmp_path / "a", "plain", 0, [0.1], [0.1])
    write_run(tmp_path / "b", "plain", 0, [0.9], [0.9], data="arguana")
    runs = find_runs([tmp_path])
    assert assign_cells(runs) == ["data.name"]
    table = summary_table(runs)
    assert sorted(table["cell"]) == ["plain data=arguana", "plain data=demo"] and (table["seeds"] == 1).all()


def test_std_over_seeds_uses_ddof_1(tmp_path):
    write_run(tmp_path / "a", "plain", 0, [0.2], [0.1])
    write_run(tmp_path / "b", "plain", 1, [0.4], [0.3])
    runs = find_runs([tmp_path])
    assign_cells(runs)
    row = summary_table(runs, n_boot=100).iloc[0]
    assert row["test_top1_std"] == pytest.approx(np.std([0.1, 0.3], ddof=1))  # 0.1414, not 0.1


def test_comparisons_against_a_setting_and_a_variant_in_one_holm_family(tmp_path):
    """--reference eval.retrieve=sim pairs each cell with the cell that differs only in that key; with --reference
    plain as well, one table holds both kinds and Holm adjusts over all of them."""
    q = 100
    hits = {("plain", "sim"): 20, ("plain", "encoder"): 50, ("ln", "sim"): 30, ("ln", "encoder"): 30}
    for i, ((variant, retrieve), n) in enumerate(hits.items()):
        for seed in (0, 1):
            h = np.zeros(q, bool)
            h[:n] = True
            folder = write_run(tmp_path / f"{i}_{seed}", variant, seed, [0.1], [n / q], h)
            config = yaml.safe_load((folder / ".hydra" / "config.yaml").read_text())
            config["eval"] = {"retrieve": retrieve}
            (folder / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    runs = find_runs([tmp_path])
    assign_cells(runs)
    # the default resamples: with 500, a p of 0 is known only to [0, 0.035], too wide for a Holm family of 4
    table = paired_comparisons(runs, ["plain", "eval.retrieve=sim"])
    got = {(c, v): d for c, v, d in zip(table["cell"], table["vs"], table["diff_test_top1"], strict=True)}
    assert got == pytest.approx(
        {
            ("ln retrieve=encoder", "plain retrieve=encoder"): -0.2,
            ("ln retrieve=sim", "plain retrieve=sim"): 0.1,
            ("ln retrieve=encoder", "ln retrieve=sim"): 0.0,
            ("plain retrieve=encoder", "plain retrieve=sim"): 0.3,
        }
    )
    assert np.allclose(table["p_holm"], holm(table["p"]))  # one family of 4
    assert (
        dict(zip(table["vs"] + "|" + table["cell"], table["verdict"], strict=True))[
            "plain retrieve=sim|plain retrieve=encoder"
        ]
        == "better"
    )


def test_paired_comparison_splits_unseen_and_seen(tmp_path):
    """On official splits (test_seen.npy has both groups) the paired table also gives the difference on each group:
    ln gains 40 points on the 50 seen queries and loses 20 on the 50 unseen ones, +10 overall."""
    seen = np.zeros(100, bool)
    seen[50:] = True
    plain, ln = np.zeros(100, bool), np.zeros(100, bool)
    plain[:20] = True  # plain: 20 unseen hits
    ln[:10], ln[50:70] = True, True  # ln: 10 unseen, 20 seen
    for seed in (0, 1, 2):
        for variant, hits in (("plain", plain), ("ln", ln)):
            folder = write_run(tmp_path / f"{variant}_{seed}", variant, seed, [0.1], [hits.mean()], hits)
            np.save(folder / "test_seen.npy", seen)
    runs = find_runs([tmp_path])
    assign_cells(runs)
    c = paired_comparisons(runs, n_boot=500).set_index("cell").loc["ln"]
    assert c["diff_test_top1"] == pytest.approx(0.1)
    assert c["diff_unseen"] == pytest.approx(-0.2) and c["diff_seen"] == pytest.approx(0.4)
    assert c["queries_unseen"] == 50 and c["ci_unseen_high"] < 0 < c["ci_seen_low"]


def _loss_runs(tmp_path, hits_of):
    """Runs of two losses, each at its own head_lr (the settings changed together), seeds 0-2."""
    for (variant, loss, lr), n in hits_of.items():
        for seed in (0, 1, 2):
            h = np.zeros(100, bool)
            h[:n] = True
            folder = write_run(tmp_path / f"{variant}_{loss}_{seed}", variant, seed, [0.1], [n / 100], h)
            config = yaml.safe_load((folder / ".hydra" / "config.yaml").read_text())
            config.update(loss={"name": loss}, trainer={"head_lr": lr})
            (folder / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    runs = find_runs([tmp_path])
    assign_cells(runs)
    return runs


def test_a_reference_of_settings_changed_together(tmp_path):
    """--reference loss.name=triplet_ce,trainer.head_lr=3e-4 pairs each infonce cell (at 1e-3) with the same variant
    under triplet_ce (at 3e-4); loss.name=triplet_ce alone pairs nothing, and a named reference that pairs nothing
    is an error rather than a silently empty table."""
    runs = _loss_runs(
        tmp_path,
        {
            ("plain", "triplet_ce", 3e-4): 20,
            ("plain", "infonce", 1e-3): 35,
            ("ln", "triplet_ce", 3e-4): 30,
            ("ln", "infonce", 1e-3): 25,
        },
    )
    table = paired_comparisons(runs, "loss.name=triplet_ce,trainer.head_lr=3e-4", n_boot=500)
    got = {(c, v): d for c, v, d in zip(table["cell"], table["vs"], table["diff_test_top1"], strict=True)}
    assert got == pytest.approx(
        {
            ("plain loss=infonce head_lr=0.001", "plain loss=triplet_ce head_lr=0.0003"): 0.15,
            ("ln loss=infonce head_lr=0.001", "ln loss=triplet_ce head_lr=0.0003"): -0.05,
        }
    )
    assert set(table["seeds"]) == {3} and np.allclose(table["p_holm"], holm(table["p"]))
    assert paired_comparisons(runs, "loss.name=triplet_ce", n_boot=100).empty
    with pytest.raises(SummaryError, match="loss.name=triplet_ce pairs no two cells.*loss.name, trainer.head_lr"):
        paired_comparisons(runs, "loss.name=triplet_ce", n_boot=100, strict=True)
    with pytest.raises(SummaryError, match="'fast' is not a number"):
        paired_comparisons(runs, "trainer.head_lr=fast", n_boot=100)


@pytest.mark.slow
def test_plot_top1_stops_before_writing_when_a_reference_pairs_nothing(tmp_path, capsys):
    from biencoder.summary import main

    _loss_runs(tmp_path / "runs", {("plain", "triplet_ce", 3e-4): 20, ("plain", "infonce", 1e-3): 35})
    out = tmp_path / "out" / "top1.png"
    out.parent.mkdir()
    assert (
        main([str(tmp_path / "runs"), "--out", str(out), "--reference", "loss.name=triplet_ce", "--n-boot", "100"])
        != 0
    )
    assert "pairs no two cells" in capsys.readouterr().err and not any(out.parent.iterdir())
    assert (
        main(
            [
                str(tmp_path / "runs"),
                "--out",
                str(out),
                "--n-boot",
                "100",
                "--reference",
                "loss.name=triplet_ce,trainer.head_lr=3e-4",
            ]
        )
        == 0
    )
    assert (
        "| plain loss=infonce head_lr=0.001 | plain loss=triplet_ce head_lr=0.0003 | 3 (matched"
        in out.with_suffix(".md").read_text()
    )


@pytest.mark.slow
def test_a_named_reference_whose_runs_are_unfinished_is_no_error(tmp_path, capsys):
    """Mid-sweep: the reference cell exists but none of its runs finished, so its comparisons wait (no row) instead
    of stopping the plot; --reference with another metric or with --x is refused, since it pairs test top-1."""
    from biencoder.summary import main

    runs_dir = tmp_path / "runs"
    _loss_runs(runs_dir, {("plain", "infonce", 1e-3): 35})
    write_run(runs_dir / "plain_triplet_running", "plain", 0, [0.1], [0.2], complete=False)
    config = yaml.safe_load((runs_dir / "plain_triplet_running" / ".hydra" / "config.yaml").read_text())
    config.update(loss={"name": "triplet_ce"}, trainer={"head_lr": 3e-4})
    (runs_dir / "plain_triplet_running" / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    runs = find_runs([runs_dir])
    assign_cells(runs)
    assert paired_comparisons(runs, "loss.name=triplet_ce,trainer.head_lr=3e-4", n_boot=100, strict=True).empty
    for extra in (["--metric", "mrr"], ["--x", "trainer.head_lr"]):
        assert main([str(runs_dir), "--reference", "plain", "--out", str(tmp_path / "x.png"), *extra]) == 2
        assert "--reference pairs test top-1 per query" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()
