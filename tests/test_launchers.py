"""Sweeps through Hydra's launcher plugins: a real 2-job joblib sweep, and the SLURM preset's composition."""

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, compose_cfg


def test_joblib_sweep_runs_two_jobs(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "biencoder.train", "-m", "hydra/launcher=parallel", "model=tiny",
           "trainer.progress=false", "trainer.max_epochs=1", "trainer.batch_size=8", "eval.tasks=false",
           "+variant=ln,plain", f"hydra.sweep.dir={sweep}"]
    env = {**os.environ, "BIENCODER_JOBS": "2", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Joblib.Parallel(n_jobs=2" in proc.stdout + proc.stderr  # really launched by the plugin
    jobs = sorted(p.name for p in sweep.iterdir() if (p / "final.json").exists())
    assert jobs == ["0_ln_s0", "1_plain_s0"]
    for job in jobs:
        assert json.loads((sweep / job / "final.json").read_text())["status"] == "done"


def test_slurm_preset_composes():
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from conftest import CONF

    compose_cfg()  # registers the schema and resolvers
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["hydra/launcher=slurm", "hydra.launcher.partition=gpu"],
                      return_hydra_config=True)
    launcher = OmegaConf.to_container(cfg.hydra.launcher)
    assert launcher["_target_"].endswith("SlurmLauncher")
    assert launcher["partition"] == "gpu" and launcher["gpus_per_node"] == 1 and launcher["timeout_min"] == 240


def test_optuna_preset_maximises_best_val_top1(tmp_path):
    """+hparams_search=head_lr: Optuna's TPE over trainer.head_lr, direction maximize, objective = each run's best val
    top-1; the reported best is the best of the trials' final.json."""
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper", reason="pip install -e '.[tune]'")
    import yaml

    sweep = tmp_path / "opt"
    proc = subprocess.run([sys.executable, "-m", "biencoder.train", "-m", "+hparams_search=head_lr", "+variant=ln",
                           "model=tiny", "trainer.max_epochs=2", "trainer.progress=false", "eval.tasks=false",
                           "hydra.sweeper.n_trials=3", f"hydra.sweep.dir={sweep}", f"paths.log_dir={tmp_path}"],
                          capture_output=True, text=True, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    finals = [json.loads(f.read_text()) for f in sweep.glob("*/final.json")]
    assert len(finals) == 3
    assert result["best_value"] == pytest.approx(max(f["best"]["val"]["top1"] for f in finals))
    assert 1e-4 <= result["best_params"]["trainer.head_lr"] <= 3e-2


def test_a_sweep_ends_with_its_folder_and_table(tmp_path):
    sweep = tmp_path / "sweep"
    proc = subprocess.run([sys.executable, "-m", "biencoder.train", "-m", "+variant=ln,plain", "model=tiny",
                           "trainer.max_epochs=1", "trainer.progress=false", "eval.tasks=false",
                           f"hydra.sweep.dir={sweep}", f"paths.log_dir={tmp_path}"],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    tail = proc.stdout[proc.stdout.index("== sweep finished"):]
    assert str(sweep) in tail and "| ln | 1 |" in tail and "| plain | 1 |" in tail
    assert f"python scripts/plot_top1.py {sweep}" in tail and (sweep / "top1.png").is_file()
