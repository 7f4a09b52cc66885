"""The stability study's per-run behaviours and per-cell lr ranges, on hand-made runs with known answers."""

import json

import numpy as np
import pytest
import yaml

from biencoder.report.runs import assign_cells, find_runs
from biencoder.report.stability import run_outcomes, stability_tables
from biencoder.summary import main
from helpers import write_run


def lr_run(folder, variant, seed, lr, val, status="done"):
    write_run(folder, variant, seed, val, [v - 0.05 for v in val])
    config_file = folder / ".hydra" / "config.yaml"
    config = yaml.safe_load(config_file.read_text())
    config["trainer"] = {"head_lr": lr}
    config_file.write_text(yaml.safe_dump(config))
    final = json.loads((folder / "final.json").read_text())
    (folder / "final.json").write_text(json.dumps({**final, "status": status}))


@pytest.fixture
def sweep(tmp_path):
    flat = [0.2] * 6
    # ln: best val per lr (two seeds): 1e-3 → 0.29, 0.30 (mean 0.295); 1e-2 → 0.30, 0.30; 1e-1 → 0.25, 0.25
    lr_run(tmp_path / "a", "ln", 0, 1e-3, [0.29, 0.28, 0.29, 0.28, 0.29, 0.28])
    lr_run(tmp_path / "b", "ln", 1, 1e-3, [0.1, 0.30, 0.28, 0.30, 0.28, 0.30])  # post-best noise: diffs ∓0.02
    lr_run(tmp_path / "c", "ln", 0, 1e-2, [0.30, 0.2, 0.2, 0.2, 0.2, 0.2])  # collapses: ends 10 points below
    lr_run(tmp_path / "d", "ln", 1, 1e-2, [0.30, 0.27, 0.27, 0.27, 0.27, 0.27])  # 3 points below: no collapse
    lr_run(tmp_path / "e", "ln", 0, 1e-1, [0.25] * 6)
    lr_run(tmp_path / "f", "ln", 1, 1e-1, [0.25] + [0.1] * 5, status="diverged")
    # plain: one good lr only (1e-2: 0.40; the others 0.20)
    for name, seed, lr, val in (("g", 0, 1e-3, flat), ("h", 0, 1e-2, [0.4] * 6), ("i", 0, 1e-1, flat)):
        lr_run(tmp_path / name, "plain", seed, lr, val)
    return tmp_path


def test_outcomes_and_ranges_by_hand(sweep):
    runs = find_runs([sweep])
    assert assign_cells(runs, also=("trainer.head_lr",)) == []  # lr is the x-axis, not a cell
    out = run_outcomes(runs, "trainer.head_lr").set_index(["cell", "x", "seed"])
    assert out.loc[("ln", 1e-2, 0), "collapsed"] and not out.loc[("ln", 1e-2, 1), "collapsed"]
    assert out.loc[("ln", 1e-1, 1), "diverged"] and not out.loc[("ln", 1e-1, 0), "diverged"]
    assert out.loc[("ln", 1e-3, 1), "post_best_noise"] == pytest.approx(np.std([-0.02, 0.02, -0.02, 0.02], ddof=1))
    assert out.loc[("ln", 1e-3, 1), "best_epoch"] == 1 and out.loc[("ln", 1e-3, 1), "test_at_best"] == pytest.approx(
        0.25
    )

    per_x, per_cell = stability_tables(run_outcomes(runs, "trainer.head_lr"))
    ln, plain = per_cell.set_index("cell").loc["ln"], per_cell.set_index("cell").loc["plain"]
    assert ln["best_x"] == 1e-2 and ln["best_val_mean"] == pytest.approx(0.30)
    assert (ln["within_1pt_low"], ln["within_1pt_high"]) == (1e-3, 1e-2)  # 0.295 is within 1 point, 0.25 is not
    assert ln["width_decades"] == pytest.approx(1.0)
    assert ln["diverged_share"] == pytest.approx(1 / 6) and ln["collapsed_share"] == pytest.approx(2 / 6)
    assert plain["width_decades"] == pytest.approx(0.0) and plain["best_x"] == 1e-2
    assert per_x.set_index(["cell", "x"]).loc[("ln", 1e-3), "best_val_mean"] == pytest.approx(0.295)


@pytest.mark.slow
def test_cli_against_a_key(sweep, capsys):
    assert main([str(sweep), "--x", "trainer.head_lr", "--n-boot", "200"]) == 0
    out = capsys.readouterr().out
    assert "| ln | 0.01 |" in out and "0.001 – 0.01 | 1.0 |" in out
    for name in (
        "top1_vs_head_lr.png",
        "top1_vs_head_lr.md",
        "top1_vs_head_lr.csv",
        "top1_vs_head_lr_per_value.csv",
        "top1_vs_head_lr_runs.csv",
    ):
        assert (sweep / name).is_file()
    assert main([str(sweep), "--x", "head_lr"]) == 2
    assert "did you mean trainer.head_lr?" in capsys.readouterr().err
