import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from biencoder.summary import (assign_cells, bootstrap_ci, find_runs, holm, main, paired_bootstrap, paired_comparisons,
                               summary_table, verdict)
from conftest import FAST, REPO, compose_cfg


def write_run(folder: Path, variant: str, seed: int, val: list[float], test: list[float], hits=None,
              complete=True, data="demo", tasks=None):
    """A run folder in the runner's format with the given per-epoch val/test top1 (train rows too)."""
    (folder / ".hydra").mkdir(parents=True)
    ln, relu = {"ln_relu": (True, True), "ln": (True, False), "relu": (False, True), "plain": (False, False)}[variant]
    config = {"seed": seed, "data": {"name": data, "root": None}, "model": {"name": "tiny", "head": {"use_layernorm": ln, "use_relu": relu}}}
    (folder / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    rows = []
    for epoch, (v, t) in enumerate(zip(val, test)):
        base = {"epoch": epoch, "variant": variant, "seed": seed, "retrieval_top1": 0.0, "mrr": 0.0, "recall_at_k": 0.0}
        rows += [{**base, "split": "train", "top1": 0.5, "loss": 2.0 - epoch, "head_post_sample_var": 1.0},
                 {**base, "split": "val", "top1": v}, {**base, "split": "test", "top1": t}]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if hits is not None:
        np.save(folder / "test_hits.npy", np.asarray(hits, dtype=bool))
    if complete:
        final = {"status": "done", "variant": variant, "seed": seed}
        if tasks:
            final["tasks"] = {"score": "rerank", "test": {k: {"accuracy_at_1": a} for k, a in tasks.items()}}
        (folder / "final.json").write_text(json.dumps(final))
    return folder


def test_discovery_grouping_and_aggregation(tmp_path):
    q = 100
    plain_hits = np.zeros(q, bool)
    plain_hits[:20] = True
    ln_hits = np.zeros(q, bool)
    ln_hits[:50] = True  # ln gets 30 more queries right, and loses none
    write_run(tmp_path / "sweeps/a/0_plain_s0", "plain", 0, [0.1, 0.3, 0.2], [0.1, 0.2, 0.3], plain_hits, tasks={"sdoc": 0.5})
    write_run(tmp_path / "sweeps/a/1_plain_s1", "plain", 1, [0.2, 0.1, 0.4], [0.0, 0.1, 0.2], plain_hits, tasks={"sdoc": 0.7})
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
    assert table.loc["plain", "test_top1_mean"] == pytest.approx(0.2) and table.loc["plain", "test_top1_std"] == pytest.approx(0.0)
    assert table.loc["ln", "val_top1_mean"] == pytest.approx(0.4) and table.loc["ln", "test_top1_mean"] == pytest.approx(0.45)
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


def test_bootstrap_known_answers():
    ones, zeros = np.ones(50), np.zeros(50)
    diff, low, high, p = paired_bootstrap(ones, zeros)
    assert (diff, low, high, p) == (1.0, 1.0, 1.0, 0.0)
    same = np.random.default_rng(0).integers(0, 2, 300).astype(float)
    diff, low, high, p = paired_bootstrap(same, same)
    assert (diff, low, high) == (0.0, 0.0, 0.0) and p == 1.0 and verdict(diff, p) == "no significant difference"
    # Bernoulli(0.6), n = 2000: the normal approximation gives a half-width of 1.96·sqrt(.24/2000) ≈ 0.0215
    x = np.zeros(2000)
    x[:1200] = 1
    mean, low, high = bootstrap_ci(x, n_boot=4000)
    assert mean == 0.6 and low == pytest.approx(0.6 - 0.0215, abs=0.004) and high == pytest.approx(0.6 + 0.0215, abs=0.004)
    assert verdict(-0.05, 0.01) == "worse" and verdict(0.05, 0.01) == "better" and verdict(0.05, 0.2) != "better"


def test_two_level_bootstrap_sees_seed_variation():
    """Three seeds whose models disagree completely (all queries right, all wrong, all right): a query-level
    bootstrap calls the mean exact, a seeds-then-queries bootstrap spreads it over the 4 values 0, 1/3, 2/3, 1."""
    hits = np.array([np.ones(400), np.zeros(400), np.ones(400)])
    assert bootstrap_ci(hits, n_boot=4000, two_level=False)[1:] == (pytest.approx(2 / 3), pytest.approx(2 / 3))
    mean, low, high = bootstrap_ci(hits, n_boot=4000)  # 3 seeds: two levels by default
    assert mean == pytest.approx(2 / 3) and low == 0.0 and high == 1.0  # P(all three draws = seed 2) = 1/27 > 2.5%
    # paired: a difference that one seed in three shows is not significant at the seed level
    a, b = np.array([np.ones(400), np.zeros(400), np.zeros(400)]), np.zeros((3, 400))
    assert paired_bootstrap(a, b, n_boot=4000, two_level=False)[3] == 0.0
    assert paired_bootstrap(a, b, n_boot=4000)[3] > 0.05


def test_holm_on_known_p_values():
    from biencoder.summary import holm

    # sorted 0.01, 0.03, 0.04 -> x3, x2, x1 = 0.03, 0.06, 0.04 -> monotone 0.03, 0.06, 0.06
    np.testing.assert_allclose(holm([0.01, 0.04, 0.03]), [0.03, 0.06, 0.06])
    np.testing.assert_allclose(holm([0.5, 0.9]), [1.0, 1.0])
    assert holm([0.02]).tolist() == [0.02]


def test_std_over_seeds_uses_ddof_1(tmp_path):
    write_run(tmp_path / "a", "plain", 0, [0.2], [0.1])
    write_run(tmp_path / "b", "plain", 1, [0.4], [0.3])
    runs = find_runs([tmp_path])
    assign_cells(runs)
    row = summary_table(runs, n_boot=100).iloc[0]
    assert row["test_top1_std"] == pytest.approx(np.std([0.1, 0.3], ddof=1))  # 0.1414, not 0.1


def test_cli_outputs_and_errors(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main([str(empty)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no run folders" in err[0]
    assert main([str(tmp_path / "missing")]) == 2
    capsys.readouterr()
    write_run(tmp_path / "logs/x", "plain", 0, [0.1, 0.2], [0.1, 0.2], np.ones(10))
    write_run(tmp_path / "logs/y", "ln", 0, [0.1, 0.2], [0.1, 0.2], np.ones(10))
    write_run(tmp_path / "logs/z", "ln", 1, [0.3], [0.3], complete=False)
    assert main([str(tmp_path / "logs"), "--internals"]) == 0
    out = capsys.readouterr().out
    assert "no significant difference" in out and "(+1 incomplete)" in out
    for name in ("top1.png", "top1.md", "top1.csv", "top1_paired.csv", "top1_internals.png"):
        assert (tmp_path / "logs" / name).stat().st_size > 0


def test_script_on_real_runner_output(tmp_path):
    for variant in ("plain", "ln"):
        from biencoder.train import run
        out = tmp_path / f"{variant}_s0"
        run(compose_cfg(FAST + [f"+variant={variant}", "trainer.max_epochs=1", "eval.tasks=false"]), out)
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "plot_top1.py"), str(tmp_path), "--metric", "mrr",
                           "--split", "val", "test"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "| ln |" in proc.stdout and (tmp_path / "mrr.png").is_file()


def test_runs_from_before_a_new_key_share_its_default(tmp_path):
    """A key added later (eval.retrieve) takes its schema default for older runs: no spurious cells, and an old
    run and a new one with the same settings are one cell; a run that sets it otherwise is its own cell."""
    from biencoder.config import run_settings

    assert run_settings({"eval": {"k": 10}})["eval.retrieve"] == "sim"
    assert run_settings({"eval": {"retrieve": "encoder"}})["eval.retrieve"] == "encoder"
    write_run(tmp_path / "old", "plain", 0, [0.1], [0.1])
    new = write_run(tmp_path / "new", "plain", 1, [0.2], [0.2])
    other = write_run(tmp_path / "other", "plain", 0, [0.3], [0.3])
    for folder, retrieve in ((new, "sim"), (other, "encoder")):
        config = yaml.safe_load((folder / ".hydra" / "config.yaml").read_text())
        config["eval"] = {"retrieve": retrieve}
        (folder / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    runs = find_runs([tmp_path])
    assert assign_cells(runs) == ["eval.retrieve"]
    cells = {r.path.name: r.cell for r in runs}
    assert cells["old"] == cells["new"] == "plain retrieve=sim" and cells["other"] == "plain retrieve=encoder"


def test_a_six_cell_figure_keeps_every_legend_entry_inside(tmp_path):
    """Six cells with long labels (a key that differs, and a model group whose name differs): labels stay short,
    every legend entry lies inside the saved image, and two identical curves stay distinguishable (markers)."""
    from PIL import Image

    from biencoder.summary import figure, plot

    for i, variant in enumerate(("ln", "ln_relu", "relu", "plain", "ln", "relu")):
        folder = write_run(tmp_path / f"r{i}", variant, 0, [0.1, 0.2, 0.3], [0.1, 0.2, 0.3])
        config = yaml.safe_load((folder / ".hydra" / "config.yaml").read_text())
        config["trainer"] = {"head_lr": 0.003 if i < 4 else 0.0003}
        config["model"]["name"] = "tiny" if i == 5 else "minilm"
        config["model"]["encoder"] = {"random_init": {"num_hidden_layers": 2} if i == 5 else None}
        (folder / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    runs = find_runs([tmp_path])
    assign_cells(runs)
    labels = sorted(r.cell for r in runs)
    assert "relu model=tiny head_lr=0.0003" in labels and not any("random_init" in label for label in labels)
    fig = figure(runs)
    fig.canvas.draw()
    texts = [t for legend in fig.legends for t in legend.get_texts()]
    assert len(texts) == 6
    width, height = fig.canvas.get_width_height()
    for text in texts:
        box = text.get_window_extent()
        assert box.x0 >= 0 and box.y0 >= 0 and box.x1 <= width and box.y1 <= height, text.get_text()
    markers = {line.get_marker() for line in fig.axes[0].get_lines()}
    assert len(markers) == 6  # identical curves, six different markers
    out = plot(runs, tmp_path / "six.png")
    saved = Image.open(out).size  # the saved image is the checked canvas (at 120 dpi), not cropped
    assert abs(saved[0] - fig.get_figwidth() * 120) <= 1 and abs(saved[1] - fig.get_figheight() * 120) <= 1


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
    table = paired_comparisons(runs, ["plain", "eval.retrieve=sim"], n_boot=500)
    got = {(c, v): d for c, v, d in zip(table["cell"], table["vs"], table["diff_test_top1"])}
    assert got == pytest.approx({("ln retrieve=encoder", "plain retrieve=encoder"): -0.2,
                                 ("ln retrieve=sim", "plain retrieve=sim"): 0.1,
                                 ("ln retrieve=encoder", "ln retrieve=sim"): 0.0,
                                 ("plain retrieve=encoder", "plain retrieve=sim"): 0.3})
    assert np.allclose(table["p_holm"], holm(table["p"]))  # one family of 4
    assert dict(zip(table["vs"] + "|" + table["cell"], table["verdict"]))[
        "plain retrieve=sim|plain retrieve=encoder"] == "better"


def test_paired_comparison_splits_unseen_and_seen(tmp_path):
    """On official splits (test_seen.npy has both groups) the paired table also gives the difference on each group:
    ln gains 40 points on the 50 seen queries and loses 20 on the 50 unseen ones, +10 overall."""
    seen = np.zeros(100, bool)
    seen[50:] = True
    plain, ln = np.zeros(100, bool), np.zeros(100, bool)
    plain[:20] = True            # plain: 20 unseen hits
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
