"""The plot command (biencoder.summary, scripts/plot_top1.py): outputs and errors, on hand-made and real runs."""

import os
import subprocess
import sys

import numpy as np
import pytest
from omegaconf import OmegaConf

from biencoder.callbacks import SweepSummary
from biencoder.summary import main
from conftest import FAST, REPO, compose_cfg
from helpers import console_scripts, write_run


@pytest.mark.slow
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


def _two_by_two(logs, n_seeds=3):
    """The card's four cells, ``n_seeds`` seeds each, planted with LayerNorm −10 points and ReLU +10 (no interaction)
    on 100 test queries."""
    for variant, right in {"plain": 30, "ln": 20, "relu": 40, "ln_relu": 30}.items():
        for seed in range(n_seeds):
            hits = np.arange(100) < right
            write_run(logs / f"{variant}_s{seed}", variant, seed, [0.1], [right / 100], hits)


@pytest.mark.slow
def test_a_two_by_two_gets_its_factorial_section_and_csv_and_the_baselines_say_why_not(tmp_path, capsys, caplog):
    """Cells crossing LayerNorm × ReLU: top1.md gains the factorial section and top1_factorial.csv its effects;
    the baselines are on by default, and where they cannot be computed (these hand-made runs name no encoder) one
    warning line says why, top1.md says so, and the rest is written; --no-baselines leaves the section out."""
    logs = tmp_path / "logs"
    _two_by_two(logs)
    with caplog.at_level("WARNING", logger="biencoder"):
        assert main([str(logs), "--n-boot", "500"]) == 0
    out = capsys.readouterr().out
    warnings = [r.getMessage() for r in caplog.records if r.getMessage().startswith("baselines not computed")]
    assert len(warnings) == 1 and "no model.encoder.name_or_path" in warnings[0]
    markdown = (logs / "top1.md").read_text()
    assert "### Against zero-shot and TF-IDF (all test queries)\n\nNot computed: " in markdown
    assert "### Factorial effects: use_layernorm × use_relu" in markdown and markdown.strip() in out
    csv = (logs / "top1_factorial.csv").read_text().splitlines()
    assert csv[0].startswith("effect,factor,contrast,cells,seeds,pairing,metric,effect_pt,ci_low_pt,ci_high_pt,p,")
    assert [line.split(",")[:2] for line in csv[1:]] == [
        ["main effect", "use_layernorm"],
        ["main effect", "use_relu"],
        ["interaction", "use_layernorm × use_relu"],
    ]
    assert "top1_factorial.csv" in out.splitlines()[-1]  # listed with the other tables
    assert main([str(logs), "--n-boot", "500", "--no-baselines"]) == 0
    assert "zero-shot" not in (logs / "top1.md").read_text() and "Factorial" in (logs / "top1.md").read_text()


@pytest.mark.slow
def test_factors_that_cannot_be_read_stop_the_plot_before_it_writes(tmp_path, capsys):
    """--factors naming a key that separates no cells, or asked with --x, is one line and exit 2, nothing written;
    the two options that disagree about the baselines too."""
    logs = tmp_path / "logs"
    _two_by_two(logs, n_seeds=1)
    for extra, why in (
        (["--factors", "model.head.use_relu", "data.name"], "--factors data.name: it does not separate the cells"),
        (["--factors", "model.head.use_relu", "--x", "seed"], "--factors goes with the per-cell table"),
        (["--baselines", "--no-baselines"], "ask for opposite things"),
    ):
        assert main([str(logs), "--n-boot", "100", *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and why in err[0], err
        assert not (logs / "top1.png").exists() and not (logs / "top1.md").exists()


@pytest.mark.slow
def test_one_corrupt_run_is_left_out_and_the_others_compared(tmp_path, capsys, caplog):
    """One run folder with a bad line inside its metrics.jsonl: a warning names it, the other runs are compared."""
    logs = tmp_path / "logs"
    _two_by_two(logs, n_seeds=2)
    bad = logs / "ln_s1" / "metrics.jsonl"
    bad.write_text("{not json\n" + bad.read_text())
    with caplog.at_level("WARNING", logger="biencoder"):
        assert main([str(logs), "--n-boot", "100", "--no-baselines"]) == 0
    assert f"{bad.parent}: skipped, {bad} line 1 is not JSON" in caplog.text
    assert "| ln | 1 |" in capsys.readouterr().out


def test_the_sweep_ends_with_a_command_that_works_from_any_directory(tmp_path, capsys, monkeypatch):
    """The closing hint is biencoder-plot (the installed command, pyproject's console script) with the sweep's
    absolute folder, whatever the working directory the sweep ran in."""
    assert console_scripts()["biencoder-plot"] == "biencoder.summary:main"
    import biencoder.summary

    monkeypatch.setattr(biencoder.summary, "main", lambda argv: 0)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sweep" / "0_plain_s0").mkdir(parents=True)
    (tmp_path / "sweep" / "0_plain_s0" / "final.json").write_text("{}")
    SweepSummary().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": "sweep"}}}))
    assert capsys.readouterr().out.strip().splitlines()[-1].endswith(f": biencoder-plot {tmp_path / 'sweep'}")


@pytest.mark.slow
def test_biencoder_plot_runs_from_another_directory(tmp_path):
    """The installed biencoder-plot, started in a folder outside the repository on a folder given by its absolute
    path, compares the runs (this checkout's code first on the path)."""
    command = os.path.join(os.path.dirname(sys.executable), "biencoder-plot")
    if not os.path.exists(command):
        pytest.skip("biencoder-plot is not installed beside this Python (pip install -e .)")
    _two_by_two(tmp_path / "logs", n_seeds=1)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [command, str(tmp_path / "logs"), "--n-boot", "100"], capture_output=True, text=True, cwd=elsewhere, env=env
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "logs" / "top1_factorial.csv").is_file() and not any(elsewhere.iterdir())
