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
