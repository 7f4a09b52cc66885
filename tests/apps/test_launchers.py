"""Sweeps through Hydra's launcher plugins: a real 2-job joblib sweep, the SLURM preset's composition, and the
submitit machinery of that preset run for real through its local executor (pickled jobs, a killed job resumed)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, compose_cfg


@pytest.mark.slow
def test_joblib_sweep_runs_two_jobs(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    sweep = tmp_path / "sweep"
    cmd = [
        sys.executable,
        "-m",
        "biencoder.train",
        "-m",
        "hydra/launcher=parallel",
        "model=tiny",
        "trainer.progress=false",
        "trainer.max_epochs=1",
        "trainer.batch_size=8",
        "eval.tasks=false",
        "+variant=ln,plain",
        f"hydra.sweep.dir={sweep}",
    ]
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
    from omegaconf import OmegaConf

    cfg = compose_cfg(["hydra/launcher=slurm", "hydra.launcher.partition=gpu"], hydra_config=True)
    launcher = OmegaConf.to_container(cfg.hydra.launcher)
    assert launcher["_target_"].endswith("SlurmLauncher")
    assert launcher["partition"] == "gpu" and launcher["gpus_per_node"] == 1 and launcher["timeout_min"] == 240


def writer_of(log: Path) -> int:
    """The id of the process that holds ``log`` open (Linux /proc): the training process of a submitit job."""
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            if any(os.readlink(fd) == str(log) for fd in fd_dir.iterdir()):
                return int(fd_dir.parent.name)
        except OSError:  # a process that ended or is not ours to read
            continue
    raise AssertionError(f"no process holds {log} open")


@pytest.mark.slow
def test_submitit_local_sweep_pickles_jobs_and_resumes_a_killed_one(tmp_path):
    """The SLURM preset's machinery (hydra-submitit-launcher: each job pickled, run in its own process, its result
    pickled back) with submitit's local executor: 2 jobs; the second is killed (SIGKILL) after its first epoch is
    checkpointed; the sweep submitted again with trainer.resume=true skips the finished job and continues the killed
    one from last.pt, to the numbers of an uninterrupted run."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    from submitit.core.utils import pickle_load

    from biencoder.engine.runs.records import read_metrics
    from biencoder.engine.training.run import run

    sweep = tmp_path / "sweep"
    settings = [
        "model=tiny",
        "trainer.progress=false",
        "trainer.max_epochs=2",
        "trainer.batch_size=8",
        "eval.tasks=false",
        "trainer.device=cpu",
    ]
    cmd = [
        sys.executable,
        "-m",
        "biencoder.train",
        "-m",
        "hydra/launcher=submitit_local",
        *settings,
        "+variant=ln,plain",
        f"hydra.sweep.dir={sweep}",
        f"paths.log_dir={tmp_path}",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    killed = sweep / "1_plain_s0"
    sweeping = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO)
    deadline = time.time() + 300
    while not (killed / "last.pt").exists():  # epoch 0 is checkpointed (written atomically)
        assert sweeping.poll() is None and time.time() < deadline, sweeping.stdout.read()[-3000:]
        time.sleep(0.02)
    os.kill(writer_of(killed / "train.log"), signal.SIGKILL)
    output = sweeping.communicate(timeout=300)[0]
    assert sweeping.returncode != 0  # the launcher reports the killed job
    assert "Submitit 'local' sweep output dir" in output
    done = sweep / "0_ln_s0" / "final.json"
    assert json.loads(done.read_text())["status"] == "done" and not (killed / "final.json").exists()
    first = done.read_text()

    proc = subprocess.run(
        [*cmd, "trainer.resume=true"], capture_output=True, text=True, env=env, cwd=REPO, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert done.read_text() == first  # the finished job was skipped
    log = (killed / "train.log").read_text()
    assert "resuming" in log and "after epoch 0" in log
    rows, torn = read_metrics(killed / "metrics.jsonl")
    assert [(r["epoch"], r["split"]) for r in rows] == [(e, s) for e in (0, 1) for s in ("train", "val", "test")]
    final = json.loads((killed / "final.json").read_text())
    assert final["status"] == "done"
    # every job went through pickles both ways: submitted, then its result (Hydra's JobReturn) read back
    results = [pickle_load(p) for p in sweep.glob(".submitit/*/*_result.pkl")]
    assert len(results) == 3 and all(status == "success" for status, _ in results)  # ln twice, plain once
    best_val = {
        job: json.loads((sweep / job / "final.json").read_text())["best"]["val"]["top1"]
        for job in ("0_ln_s0", "1_plain_s0")
    }
    assert sorted(r.return_value for _, r in results) == sorted([best_val["0_ln_s0"]] * 2 + [best_val["1_plain_s0"]])
    # continued exactly: the numbers of an uninterrupted run
    alone = run(compose_cfg(settings + ["+variant=plain"]), tmp_path / "alone")
    assert final["best"] == alone["best"]


@pytest.mark.slow
def test_optuna_preset_maximises_best_val_top1(tmp_path):
    """+hparams_search=head_lr: Optuna's TPE over trainer.head_lr, direction maximize, objective = each run's best val
    top-1; the reported best is the best of the trials' final.json."""
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper", reason="pip install -e '.[tune]'")
    import yaml

    sweep = tmp_path / "opt"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "biencoder.train",
            "-m",
            "+hparams_search=head_lr",
            "+variant=ln",
            "model=tiny",
            "trainer.max_epochs=2",
            "trainer.progress=false",
            "eval.tasks=false",
            "hydra.sweeper.n_trials=3",
            f"hydra.sweep.dir={sweep}",
            f"paths.log_dir={tmp_path}",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    finals = [json.loads(f.read_text()) for f in sweep.glob("*/final.json")]
    assert len(finals) == 3
    assert result["best_value"] == pytest.approx(max(f["best"]["val"]["top1"] for f in finals))
    assert 1e-4 <= result["best_params"]["trainer.head_lr"] <= 3e-2


@pytest.mark.slow
def test_a_sweep_ends_with_its_folder_and_table(tmp_path):
    sweep = tmp_path / "sweep"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "biencoder.train",
            "-m",
            "+variant=ln,plain",
            "model=tiny",
            "trainer.max_epochs=1",
            "trainer.progress=false",
            "eval.tasks=false",
            f"hydra.sweep.dir={sweep}",
            f"paths.log_dir={tmp_path}",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    tail = proc.stdout[proc.stdout.index("== sweep finished") :]
    assert str(sweep) in tail and "| ln | 1 |" in tail and "| plain | 1 |" in tail
    assert f"biencoder-plot {sweep.resolve()}" in tail and (sweep / "top1.png").is_file()
