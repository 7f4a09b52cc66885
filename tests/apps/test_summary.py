"""The plot command (biencoder.summary, scripts/plot_top1.py): outputs and errors, on hand-made and real runs."""

import subprocess
import sys

import numpy as np
import pytest

from biencoder.summary import main
from conftest import FAST, REPO, compose_cfg
from report.test_runs import write_run


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
    # --out: an extension matplotlib cannot write (or the tables' own) is one line, before anything is written
    assert main([str(tmp_path / "logs"), "--out", str(tmp_path / "o" / "summary.md")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and ".png, .pdf, .svg" in err[0] and not (tmp_path / "o").exists()
    # no extension: the figure is a .png, and the path printed is the one written
    (tmp_path / "o").mkdir()
    assert main([str(tmp_path / "logs"), "--out", str(tmp_path / "o" / "summary")]) == 0
    assert f"figure: {tmp_path / 'o' / 'summary.png'}" in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == [
        "summary.csv",
        "summary.md",
        "summary.png",
        "summary_paired.csv",
    ]


@pytest.mark.slow
def test_script_on_real_runner_output(tmp_path):
    for variant in ("plain", "ln"):
        from biencoder.engine.training.run import run

        out = tmp_path / f"{variant}_s0"
        run(compose_cfg(FAST + [f"+variant={variant}", "trainer.max_epochs=1", "eval.tasks=false"]), out)
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "plot_top1.py"),
            str(tmp_path),
            "--metric",
            "mrr",
            "--split",
            "val",
            "test",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert "| ln |" in proc.stdout and (tmp_path / "mrr.png").is_file()
