"""logger=mlflow / tensorboard with the real libraries: what they hold equals metrics.jsonl, failed jobs are FAILED,
and a resumed run stays one run with no step logged twice."""

import json
import os
import subprocess
import sys

import pytest
import torch

from biencoder.engine.runs.records import read_metrics
from biencoder.engine.training.run import run
from biencoder.engine.training.runner import Runner
from conftest import FAST, REPO, compose_cfg

mlflow = pytest.importorskip("mlflow", reason="pip install -e '.[tracking]'")
pytest.importorskip("tensorboard", reason="pip install -e '.[tracking]'")

from mlflow.tracking import MlflowClient  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

BASE = FAST + ["+variant=ln", "eval.tasks=false", "trainer.max_epochs=4", "trainer.checkpoint_every=2"]


def same(got, want):
    """Same steps, same values (TensorBoard stores float32)."""
    return [s for s, _ in got] == [s for s, _ in want] and all(
        v == pytest.approx(w, rel=1e-6, abs=1e-7) for (_, v), (_, w) in zip(got, want, strict=True)
    )


def expected(folder, key, split):
    rows, _ = read_metrics(folder / "metrics.jsonl")
    return [(r["epoch"], r[key]) for r in rows if r["split"] == split]


def client_for(log_dir):
    return MlflowClient(tracking_uri=f"sqlite:///{log_dir / 'mlflow.db'}")


def only_run(client, experiment="runs"):
    runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    assert len(runs) == 1
    return runs[0]


def history(client, run_id, key):
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def scalars(folder, tag):
    acc = EventAccumulator(str(folder / "tensorboard"))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


@pytest.mark.slow
def test_both_loggers_hold_what_metrics_jsonl_holds(tmp_path):
    out = tmp_path / "run"
    final = run(compose_cfg(BASE + ["logger=many", f"paths.log_dir={tmp_path}"]), out)
    client = client_for(tmp_path)
    found = only_run(client)
    assert found.info.status == "FINISHED" and found.data.tags["variant"] == "ln" and found.data.tags["seed"] == "0"
    assert found.data.params["trainer.max_epochs"] == "4" and found.data.params["variant"] == "ln"
    for key, split in (("top1", "val"), ("top1", "test"), ("loss", "train"), ("head_post_sample_var", "train")):
        assert same(history(client, found.info.run_id, f"{key}/{split}"), expected(out, key, split))
        assert same(scalars(out, f"{key}/{split}"), expected(out, key, split))
    assert found.data.metrics["best/top1/val"] == pytest.approx(final["best"]["val"]["top1"])
    artifacts = [a.path for a in client.list_artifacts(found.info.run_id)]
    assert artifacts == ["final.json"]


@pytest.mark.slow
def test_a_resumed_run_is_one_run_without_repeated_steps(tmp_path, monkeypatch):
    """Killed in the last epoch's checkpoint (epochs 2 and 3 already logged), then resumed from epoch 1's."""
    out = tmp_path / "run"
    cfg = BASE + ["logger=many", f"paths.log_dir={tmp_path}"]
    calls = []
    original = Runner.save_last

    def killed_at_the_second_checkpoint(self, *args):
        calls.append(args[0])
        if len(calls) == 2:
            raise KeyboardInterrupt("killed")
        return original(self, *args)

    monkeypatch.setattr(Runner, "save_last", killed_at_the_second_checkpoint)
    with pytest.raises(KeyboardInterrupt):
        run(compose_cfg(cfg), out)
    client = client_for(tmp_path)
    assert only_run(client).info.status == "FAILED"
    assert [s for s, _ in history(client, only_run(client).info.run_id, "top1/val")] == [0, 1, 2, 3]
    monkeypatch.setattr(Runner, "save_last", original)
    final = run(compose_cfg(cfg + ["trainer.resume=true"]), out)
    assert final["status"] == "done"
    resumed = only_run(client)
    assert resumed.info.status == "FINISHED"
    assert json.loads((out / "tracking.json").read_text())["mlflow_run_id"] == resumed.info.run_id
    for key, split in (("top1", "val"), ("loss", "train")):
        want = expected(out, key, split)
        assert [s for s, _ in want] == [0, 1, 2, 3]
        assert same(history(client, resumed.info.run_id, f"{key}/{split}"), want)
        assert same(scalars(out, f"{key}/{split}"), want)  # the killed attempt's 2, 3 purged


@pytest.mark.slow
def test_a_sweep_with_a_failing_job_leaves_finished_and_failed(tmp_path):
    """Two jobs, one experiment (the sweep's); the second crashes in its first epoch. The crash is the test's own (a
    wrapper makes EpochTrainer.train_epoch raise at head_lr 2), since a too-high rate is a divergence under the fused
    optimiser, which is recorded and does not end the sweep."""
    crashing = tmp_path / "crash_at_head_lr_2.py"
    crashing.write_text(
        "from biencoder.engine.training import epoch\n"
        "train_epoch = epoch.EpochTrainer.train_epoch\n"
        "def crash(self, *args):\n"
        "    if self.settings.head_lr == 2:\n"
        "        raise RuntimeError('the crash of test_a_sweep_with_a_failing_job')\n"
        "    return train_epoch(self, *args)\n"
        "epoch.EpochTrainer.train_epoch = crash\n"
        "from biencoder.train import cli\n"
        "cli()\n"
    )
    sweep = tmp_path / "sweep"
    proc = subprocess.run(
        [
            sys.executable,
            str(crashing),
            "-m",
            *BASE,
            "trainer.max_epochs=2",
            "logger=mlflow",
            f"paths.log_dir={tmp_path}",
            f"hydra.sweep.dir={sweep}",
            "trainer.head_lr=1e-3,2",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert proc.returncode != 0  # the failed job ends the sweep (the basic launcher), after the first finished
    assert "the crash of test_a_sweep_with_a_failing_job" in proc.stderr
    client = client_for(tmp_path)
    runs = client.search_runs([client.get_experiment_by_name("sweep").experiment_id])
    by_lr = {r.data.params["trainer.head_lr"]: r for r in runs}
    assert by_lr["0.001"].info.status == "FINISHED" and by_lr["2.0"].info.status == "FAILED"
    assert by_lr["2.0"].data.tags["status"] == "failed"

    from biencoder.summary import main

    assert main([str(sweep), "--n-boot", "100"]) == 0  # the sweep's figure and tables go to its experiment
    summary = [r for r in client.search_runs([by_lr["0.001"].info.experiment_id]) if r.info.run_name == "summary"]
    assert len(summary) == 1
    assert {a.path for a in client.list_artifacts(summary[0].info.run_id)} >= {"top1.png", "top1.md", "top1.csv"}


def test_a_missing_tracker_package_is_one_line(tmp_path, monkeypatch):
    import importlib.util

    from biencoder.engine.training.run import run
    from biencoder.errors import ConfigError

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a))
    with pytest.raises(ConfigError, match=r"logger=mlflow needs the mlflow package: pip install -e '.\[tracking\]'"):
        run(compose_cfg(FAST + ["logger=mlflow"]), tmp_path / "run")
    assert not (tmp_path / "run").exists()  # refused before the run folder is made
    torch.manual_seed(0)  # nothing else to undo


def test_tracking_json_is_replaced_atomically_never_rewritten_in_place(tmp_path):
    """tracking.json goes to a temporary name and is renamed over the old file, like every other run file: a kill
    mid-write leaves the old file or the new one, never a torn one that blocks resume. A rename gives the path a new
    inode; a write in place keeps the old one (and a second link to it sees the torn bytes)."""
    from biencoder.engine.runs.tracking import Tracker

    folder = tmp_path / "run"
    folder.mkdir()
    state_file = folder / "tracking.json"
    state_file.write_text('{"note": "from the killed attempt"}\n')
    os.link(state_file, tmp_path / "second_link")
    tracker = Tracker(compose_cfg(BASE + ["logger=tensorboard"]), folder, "runs", "ln")
    tracker.open(first_epoch=0)
    tracker.finish({})
    assert json.loads(state_file.read_text()) == {"note": "from the killed attempt"}
    assert state_file.read_text().endswith("}\n")  # the file's format as before: indented JSON and a newline
    assert not state_file.samefile(tmp_path / "second_link")  # replaced, not rewritten
    assert sorted(p.name for p in folder.iterdir()) == ["tensorboard", "tracking.json"]  # no temporary file left
