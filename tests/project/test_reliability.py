"""Resume after SIGKILL, logs that cannot lie, the NaN guard, safe checkpoint loading, offline model loading."""

import ast
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from biencoder.engine.modeling.model import build_model
from biencoder.engine.runs.records import RunFolderError, append_rows, read_metrics, truncate_metrics
from biencoder.engine.training.epoch import Diverged
from biencoder.engine.training.run import run
from biencoder.errors import ConfigError
from conftest import FAST, REPO, compose_cfg

RUN = ["model=tiny", "trainer.progress=false", "trainer.batch_size=8", "+variant=ln_relu", "seed=3"]
VOLATILE = {"epoch_time_s", "wall_time_s"}


def train_cli(*args, env=None):
    return [sys.executable, "-m", "biencoder.train", *args], {**os.environ, **(env or {})}


def stable(rows):
    return [{k: v for k, v in row.items() if k not in VOLATILE} for row in rows]


def rows_of(folder: Path):
    rows, torn = read_metrics(folder / "metrics.jsonl")
    assert not torn
    return rows


@pytest.mark.slow
def test_sigkill_then_resume_equals_an_uninterrupted_run(tmp_path):
    epochs = "trainer.max_epochs=10"
    cmd, env = train_cli(*RUN, epochs, f"hydra.run.dir={tmp_path / 'whole'}")
    subprocess.run(cmd, env=env, check=True, capture_output=True, cwd=REPO)

    killed = tmp_path / "killed"
    cmd, env = train_cli(*RUN, epochs, f"hydra.run.dir={killed}")
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics = killed / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and any(r["epoch"] >= 1 for r in read_metrics(metrics)[0]):
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.02)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    assert not (killed / "final.json").exists() and (killed / "last.pt").exists()
    logged = {r["epoch"] for r in read_metrics(metrics)[0]}
    assert 1 <= max(logged) < 9

    cmd, env = train_cli(*RUN, epochs, f"trainer.resume={killed}")
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    resumed, whole = rows_of(killed), rows_of(tmp_path / "whole")
    keys = [(r["epoch"], r["split"]) for r in resumed]
    assert len(keys) == len(set(keys)) == 10 * 3  # no epoch logged twice, none missing
    assert stable(resumed) == stable(whole)  # bit-identical numbers on the CPU
    final, reference = (json.loads((d / "final.json").read_text()) for d in (killed, tmp_path / "whole"))
    assert final["status"] == "done" and stable([final]) == stable([reference])
    assert not (killed / "last.pt").exists()  # removed once the run is done (trainer.keep_last=false)
    assert "resuming" in (killed / "train.log").read_text()


# A training run (``python -m biencoder.train`` + argv[4:]) whose ``nth`` write of last.pt stops for good at a known
# point inside the write, in the writer's thread: "mid-write" (half of the bytes in the temp file, fsynced) or
# "before-rename" (the whole temp file written and fsynced, not yet renamed over last.pt). Then it writes argv[1].
PAUSED_WRITE = """
import io, os, runpy, sys, threading
from pathlib import Path

import torch

marker, point, nth = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
writes = []


def is_last(name):  # last.pt, or the temp file of a write of it
    return Path(str(name)).name == "last.pt" or Path(str(name)).name.startswith(".last.pt.")


def pause_at(here, name):
    if here != point or not is_last(name):
        return
    writes.append(name)
    if len(writes) == nth:
        thread = "main" if threading.current_thread() is threading.main_thread() else "writer"
        marker.write_text(thread)
        threading.Event().wait()  # for good: the test kills the process here


real_save, real_replace = torch.save, os.replace


def save(obj, f, *args, **kwargs):
    name = getattr(f, "name", "")
    if point == "mid-write" and is_last(name) and len(writes) == nth - 1:
        buffer = io.BytesIO()
        real_save(obj, buffer, *args, **kwargs)
        data = buffer.getvalue()
        f.write(data[: len(data) // 2])
        f.flush()
        os.fsync(f.fileno())
    pause_at("mid-write", name)
    return real_save(obj, f, *args, **kwargs)


def replace(src, dst, *args, **kwargs):
    pause_at("before-rename", src)
    return real_replace(src, dst, *args, **kwargs)


torch.save, os.replace = save, replace
sys.argv = ["biencoder.train", *sys.argv[4:]]
runpy.run_module("biencoder.train", run_name="__main__", alter_sys=True)
"""
KILL_RUN = [*RUN, "trainer.max_epochs=4"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The folder of the run that the killed and resumed runs are compared with."""
    out = tmp_path_factory.mktemp("whole") / "run"
    cmd, env = train_cli(*KILL_RUN, f"hydra.run.dir={out}")
    subprocess.run(cmd, env=env, check=True, capture_output=True, cwd=REPO)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("point", ["mid-write", "before-rename"])
def test_sigkill_during_the_background_write_then_resume_equals_an_uninterrupted_run(tmp_path, uninterrupted, point):
    """The write of epoch 1's last.pt stops inside the writer thread (at ``point``) while training goes on: epoch 2
    is logged meanwhile, then the run is killed. last.pt is epoch 0's, whole; the resumed run equals one that was
    never interrupted."""
    killed, marker = tmp_path / "killed", tmp_path / "paused"
    cmd = [sys.executable, "-c", PAUSED_WRITE, str(marker), point, "2", *KILL_RUN, f"hydra.run.dir={killed}"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    metrics = killed / "metrics.jsonl"
    deadline = time.time() + 300
    try:
        while time.time() < deadline and proc.poll() is None:
            # the write of epoch 1 is held and epoch 2 was trained and logged meanwhile: off the training path (a
            # write held in the main thread holds the training too: killed at once, and the test fails below)
            held_in = marker.read_text() if marker.exists() else ""
            trained_on = held_in == "writer" and any(r["epoch"] >= 2 for r in read_metrics(metrics)[0])
            if held_in == "main" or trained_on:
                proc.send_signal(signal.SIGKILL)
                break
            time.sleep(0.02)
    finally:
        if proc.poll() is None:
            proc.kill()
        _, err = proc.communicate()
    assert proc.returncode == -signal.SIGKILL, f"the run ended before it could be killed: {err.decode()[-2000:]}"
    assert marker.read_text() == "writer"  # the write ran outside the training (main) thread
    assert {r["epoch"] for r in read_metrics(metrics)[0]} == {0, 1, 2}  # epoch 3 waits for the held write
    assert not (killed / "final.json").exists()
    assert torch.load(killed / "last.pt", weights_only=True)["epoch"] == 0  # the previous last.pt, intact

    cmd, env = train_cli(*KILL_RUN, f"trainer.resume={killed}")
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    resumed, whole = rows_of(killed), rows_of(uninterrupted)
    assert [(r["epoch"], r["split"]) for r in resumed] == [(e, s) for e in range(4) for s in ("train", "val", "test")]
    assert stable(resumed) == stable(whole)  # bit-identical numbers on the CPU
    final, reference = (json.loads((d / "final.json").read_text()) for d in (killed, uninterrupted))
    assert final["status"] == "done" and stable([final]) == stable([reference])
    assert "resuming" in (killed / "train.log").read_text() and "after epoch 0" in (killed / "train.log").read_text()


@pytest.mark.slow
def test_resume_drops_the_rows_of_an_unfinished_epoch(tmp_path):
    out = tmp_path / "run"
    run(compose_cfg(FAST + ["trainer.max_epochs=2", "trainer.keep_last=true", "eval.tasks=false"]), out)
    reference = rows_of(out)
    state = torch.load(out / "last.pt", weights_only=True)
    # pretend the kill came after epoch 0's state was saved but while epoch 1 was being logged
    state["epoch"] = 0
    torch.save(state, out / "last.pt")
    (out / "final.json").unlink()
    with open(out / "metrics.jsonl", "a") as f:
        f.write('{"epoch": 1, "split": "tr')  # torn line
    final = run(
        compose_cfg(
            FAST + ["trainer.max_epochs=2", "trainer.keep_last=true", "eval.tasks=false", "trainer.resume=true"]
        ),
        out,
    )
    assert final["status"] == "done"
    rows = rows_of(out)
    assert [(r["epoch"], r["split"]) for r in rows] == [(r["epoch"], r["split"]) for r in reference]


@pytest.mark.slow
def test_a_sweep_rerun_with_resume_skips_finished_jobs(tmp_path):
    sweep = tmp_path / "sweep"
    args = ["-m", *FAST, "trainer.max_epochs=1", "eval.tasks=false", "+variant=ln,plain", f"hydra.sweep.dir={sweep}"]
    cmd, env = train_cli(*args)
    subprocess.run(cmd, env=env, check=True, capture_output=True, cwd=REPO)
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir() and (p / "final.json").exists())
    assert [p.name for p in jobs] == ["0_ln_s0", "1_plain_s0"]
    before = {p: (p / "metrics.jsonl").read_text() for p in jobs}
    (jobs[1] / "final.json").unlink()  # the second job "crashed" before finishing
    (jobs[1] / "metrics.jsonl").unlink()
    cmd, env = train_cli(*args, "trainer.resume=true")
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO)
    assert again.returncode == 0, again.stderr
    assert "already done" in (jobs[0] / "train.log").read_text()
    assert (jobs[0] / "metrics.jsonl").read_text() == before[jobs[0]]  # untouched
    assert json.loads((jobs[1] / "final.json").read_text())["status"] == "done"  # redone


@pytest.mark.slow
def test_resume_with_other_settings_is_refused(tmp_path):
    out = tmp_path / "run"
    run(compose_cfg(FAST + ["trainer.max_epochs=1", "eval.tasks=false"]), out)
    (out / "final.json").unlink()
    with pytest.raises(ConfigError, match=r"trainer\.lr"):
        run(
            compose_cfg(FAST + ["trainer.max_epochs=1", "eval.tasks=false", "trainer.lr=1e-4", "trainer.resume=true"]),
            out,
        )


@pytest.mark.slow
def test_a_used_folder_is_not_overwritten_without_resume(tmp_path):
    out = tmp_path / "run"
    run(compose_cfg(FAST + ["trainer.max_epochs=1", "eval.tasks=false"]), out)
    with pytest.raises(ConfigError, match="trainer.resume=true"):
        run(compose_cfg(FAST + ["trainer.max_epochs=1", "eval.tasks=false"]), out)


# -- logs -----------------------------------------------------------------------------------------------------
def test_metrics_survive_a_torn_last_line_but_not_a_corrupt_middle(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    append_rows(path, [{"epoch": 0, "split": "train"}, {"epoch": 0, "split": "val"}])
    with open(path, "a") as f:
        f.write('{"epoch": 1, "spl')
    rows, torn = read_metrics(path)
    assert torn and rows == [{"epoch": 0, "split": "train"}, {"epoch": 0, "split": "val"}]
    assert "torn last line 3" in caplog.text
    assert truncate_metrics(path, 0) == 0 and read_metrics(path) == (rows, False)  # the torn line is cut off
    path.write_text('{"epoch": 0}\nnot json\n{"epoch": 1}\n')
    with pytest.raises(RunFolderError, match="line 2"):
        read_metrics(path)


@pytest.mark.slow
def test_a_crash_leaves_final_json_failed(tmp_path, monkeypatch):
    from biencoder.engine.training.runner import Runner

    def boom(self, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Runner, "save_last", boom)
    out = tmp_path / "run"
    with pytest.raises(OSError):
        run(compose_cfg(FAST + ["trainer.max_epochs=1"]), out)
    final = json.loads((out / "final.json").read_text())
    assert final["status"] == "failed" and "No space left" in final["error"]


def encoding_runs_out_of_memory(*args, **kwargs):
    raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")


def model_load_runs_out_of_memory(*args, **kwargs):
    raise MemoryError("cannot allocate the encoder's weights")


@pytest.mark.slow
@pytest.mark.parametrize(
    "where, crash, error",
    [
        ("build_model", model_load_runs_out_of_memory, "MemoryError: cannot allocate the encoder's weights"),
        ("EncoderInputs.make", encoding_runs_out_of_memory, "RuntimeError: CUDA out of memory. Tried to allocate"),
    ],
)
def test_a_crash_during_set_up_leaves_final_json_failed(tmp_path, monkeypatch, where, crash, error):
    """A crash before the first epoch (loading the model, encoding the corpus, memory) is a run that failed, as one
    during training is: final.json says so with the error and the run's variant and seed; nothing in the folder
    looks finished (no config_resolved.yaml, metrics, best.pt)."""
    from biencoder.engine.training import runner

    owner, name = (runner, where) if "." not in where else (getattr(runner, where.split(".")[0]), where.split(".")[1])
    monkeypatch.setattr(owner, name, crash)
    out = tmp_path / "run"
    with pytest.raises((MemoryError, RuntimeError)):
        run(compose_cfg(FAST + ["+variant=ln", "seed=4"]), out)
    final = json.loads((out / "final.json").read_text())
    assert final["status"] == "failed" and final["error"].startswith(error)
    assert (final["variant"], final["seed"], final["selection"]) == ("ln", 4, {"split": "val", "metric": "top1"})
    assert not {"config_resolved.yaml", "metrics.jsonl", "best.pt", "last.pt"} & {p.name for p in out.iterdir()}


@pytest.mark.slow
def test_bad_input_found_during_set_up_writes_no_final_json(tmp_path):
    """A config the model refuses (ConfigError, found while building it) is bad input, not a failed run: nothing in
    the folder says the run happened (the app then removes what it made: tests/engine/training/test_train.py)."""
    out = tmp_path / "run"
    with pytest.raises(ConfigError, match=r"model\.max_length=600"):
        run(compose_cfg(FAST + ["model.max_length=600"]), out)
    assert not (out / "final.json").exists()


# -- guards ---------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_nan_weights_stop_the_run_as_diverged(tmp_path, monkeypatch):
    from conftest import poison_classifier

    poison_classifier(monkeypatch, at_epoch=1)
    out = tmp_path / "run"
    with pytest.raises(Diverged, match="epoch 1: non-finite loss"):
        run(compose_cfg(FAST + ["trainer.max_epochs=3"]), out)
    final = json.loads((out / "final.json").read_text())
    assert final["status"] == "diverged" and final["epoch"] == 1 and final["what"] == "loss"
    assert set(final["loss_parts"]) == {"loss", "triplet", "ce_pos", "ce_neg"}
    assert {r["epoch"] for r in rows_of(out)} == {0}  # epoch 1 never logged


def test_checkpoints_are_loaded_weights_only(tmp_path):
    """A best.pt carrying an arbitrary pickled object is refused, not executed."""
    from biencoder.engine.runs.checkpoint import load_checkpoint

    torch.save({"state_dict": {}, "model_cfg": {}, "payload": Path("x")}, tmp_path / "best.pt")
    with pytest.raises(ConfigError, match="not a readable biencoder checkpoint"):
        load_checkpoint(tmp_path / "best.pt")


def remote_code_mentions(source: str) -> list[int]:
    """Lines of the module ``source`` that name ``trust_remote_code``: as a keyword argument whatever its value (a
    variable included), a parameter, a variable, an attribute, or a string (a ``**{...}`` or ``getattr`` key)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        names = [getattr(node, field, None) for field in ("arg", "id", "attr")]
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.append(node.value.strip())
        if "trust_remote_code" in names:
            lines.append(getattr(node, "lineno", 0))
    return lines


@pytest.mark.parametrize(
    "source",
    [
        "AutoModel.from_pretrained(path, trust_remote_code=True)",
        "flag = cfg.get('remote')\nAutoModel.from_pretrained(path, trust_remote_code=flag)",
        "AutoModel.from_pretrained(path, **{'trust_remote_code': True})",
        "def load(path, trust_remote_code=False):\n    pass",
        "options = dict(trust_remote_code=True)",
    ],
)
def test_each_way_of_passing_remote_code_is_found(source):
    assert remote_code_mentions(source) != []


@pytest.mark.slow
def test_no_remote_code_anywhere(monkeypatch):
    """No module of the package, at any depth, names ``trust_remote_code``, and building either model passes it to
    no ``transformers`` loader."""
    import transformers

    modules = sorted((REPO / "src" / "biencoder").rglob("*.py"))
    # every sub-package is read (engine/ loads the models), not only the top level
    assert {p.parent.name for p in modules} >= {"biencoder", "engine", "report"} and len(modules) >= 40
    assert [f"{p.relative_to(REPO)}:{line}" for p in modules for line in remote_code_mentions(p.read_text())] == []

    calls = []
    for cls in (transformers.AutoTokenizer, transformers.AutoConfig, transformers.AutoModel):
        for method in ("from_pretrained", "from_config"):
            if hasattr(cls, method):
                original = getattr(cls, method)
                monkeypatch.setattr(cls, method, lambda *a, _orig=original, **k: calls.append(k) or _orig(*a, **k))
    for model in ("tiny", "minilm"):
        build_model(compose_cfg([f"model={model}"]).model, progress=False)
    assert len(calls) >= 5 and not any(kwargs.get("trust_remote_code") for kwargs in calls), calls


@pytest.mark.slow
def test_local_model_runs_with_the_hub_offline(tmp_path):
    cmd, env = train_cli(
        *FAST,
        "trainer.max_epochs=1",
        "eval.tasks=false",
        f"hydra.run.dir={tmp_path / 'run'}",
        env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "run" / "final.json").read_text())["status"] == "done"
