"""One process writes a run folder at a time (``engine/runs/lock.claim``): a second process that finds the folder in
use ends with one line naming the folder and the holder (pid, host, since when), exit 2, having changed nothing; a
holder killed with SIGKILL leaves no lock behind, and the next resume says it took over a stale one."""

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from biencoder.engine.runs.folder import discard_if_ours, new_dir_resolver, run_dir_resolver
from biencoder.engine.runs.lock import LOCK_NAME, RunFolderBusy, announce_lock, claim, release
from biencoder.engine.runs.records import read_metrics
from biencoder.engine.training.run import run
from conftest import FAST, REPO, compose_cfg, hold

RUN = [
    "+variant=ln",
    "model=tiny",
    "trainer.progress=false",
    "trainer.batch_size=8",
    "trainer.max_epochs=3",
    "eval.tasks=false",
]


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "biencoder.train", *args]


def environ(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    return {**env, "BIENCODER_CACHE_DIR": str(tmp_path / "cache"), "BIENCODER_LOG_DIR": str(tmp_path / "logs")}


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def keys(folder: Path) -> list[tuple[int, str]]:
    rows, torn = read_metrics(folder / "metrics.jsonl")
    assert not torn
    return [(r["epoch"], r["split"]) for r in rows]


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A 3-epoch run of the demo corpus made by the CLI, last.pt kept."""
    tmp = tmp_path_factory.mktemp("lock")
    folder = tmp / "run"
    proc = subprocess.run(
        cli(*RUN, "trainer.keep_last=true", f"hydra.run.dir={folder}"),
        capture_output=True,
        text=True,
        cwd=REPO,
        env=environ(tmp),
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return folder


@pytest.fixture
def interrupted(finished, tmp_path) -> Path:
    """A copy of ``finished`` as a kill after epoch 0 leaves it: last.pt says epoch 0, no final.json, best.pt or
    test_hits.npy; a resume drops the rows of epochs 1-2 and trains them again."""
    folder = tmp_path / "run"
    shutil.copytree(finished, folder)
    for name in ("final.json", "best.pt", "test_hits.npy", "test_seen.npy"):
        (folder / name).unlink()
    state = torch.load(folder / "last.pt", weights_only=True)
    state["epoch"] = 0
    torch.save(state, folder / "last.pt")
    return folder


@pytest.mark.slow
def test_two_resumes_started_together_one_trains_and_one_refuses(finished, interrupted, tmp_path):
    """The issue's repro: two ``trainer.resume=<folder>`` at once (a requeued job and a resume by hand). Before the
    lock both resumed after epoch 0, both exited 0, and metrics.jsonl held every row of epochs 1-2 twice."""
    folder, env = interrupted, environ(tmp_path)
    log_before = (folder / "train.log").read_text()
    procs = [
        subprocess.Popen(
            cli(*RUN, f"trainer.resume={folder}"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env=env,
        )
        for _ in range(2)
    ]
    outputs = [proc.communicate(timeout=600) for proc in procs]
    codes = [proc.returncode for proc in procs]
    assert sorted(codes) == [0, 2], [err[-1500:] for _, err in outputs]
    winner, loser = (0, 1) if codes[0] == 0 else (1, 0)
    errors = error_lines(outputs[loser][1])
    assert len(errors) == 1 and "Traceback" not in outputs[loser][1], outputs[loser][1]
    assert str(folder) in errors[0] and "in use" in errors[0]
    assert f"pid {procs[winner].pid} on {socket.gethostname()} since " in errors[0]
    assert keys(folder) == keys(finished)  # every (epoch, split) once, in order: none twice, none missing
    assert json.loads((folder / "final.json").read_text())["status"] == "done"
    log = (folder / "train.log").read_text()
    assert log.startswith(log_before) and log[len(log_before) :].count("resuming") == 1  # the loser wrote no line
    assert (folder / LOCK_NAME).read_text() == ""  # let go at the end


@pytest.mark.slow
def test_a_resume_killed_with_sigkill_leaves_no_lock_behind(finished, interrupted, tmp_path):
    """The holder is killed mid-run; the next resume proceeds, says in one log line that it took over the stale lock
    (naming the killed process), and ends with every row once."""
    folder, env = interrupted, environ(tmp_path)
    log_before = (folder / "train.log").read_text()
    proc = subprocess.Popen(
        cli(*RUN, f"trainer.resume={folder}"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO, env=env
    )
    deadline = time.time() + 300
    while "resuming" not in (folder / "train.log").read_text()[len(log_before) :]:  # it holds the folder and writes
        assert proc.poll() is None and time.time() < deadline, "the resume ended before it could be killed"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    assert json.loads((folder / LOCK_NAME).read_text())["pid"] == proc.pid  # it died holding the folder

    done = subprocess.run(
        cli(*RUN, f"trainer.resume={folder}"), capture_output=True, text=True, cwd=REPO, env=env, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    log = (folder / "train.log").read_text()[len(log_before) :]
    takeovers = [line for line in log.splitlines() if "took over a stale lock" in line]
    assert len(takeovers) == 1 and f"pid {proc.pid} on {socket.gethostname()}" in takeovers[0], log
    assert keys(folder) == keys(finished)
    assert json.loads((folder / "final.json").read_text())["status"] == "done"
    assert (folder / LOCK_NAME).read_text() == ""


@pytest.mark.slow
def test_a_resume_of_a_held_folder_changes_nothing(interrupted, tmp_path):
    """Refused in trainer.resume's resolver, before Hydra opens the log or writes .hydra/: every file byte for byte
    (the holder's record in run.lock too), nothing added."""
    holder = hold(interrupted)
    try:
        before = snapshot(interrupted)
        proc = subprocess.run(
            cli(*RUN, f"trainer.resume={interrupted}"),
            capture_output=True,
            text=True,
            cwd=REPO,
            env=environ(tmp_path),
            timeout=600,
        )
        assert proc.returncode == 2 and len(error_lines(proc.stderr)) == 1, proc.stderr[-2000:]
        assert f"{interrupted} is in use by pid {holder.pid} on {socket.gethostname()}" in proc.stderr
        assert snapshot(interrupted) == before
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.slow
def test_claim_refuses_a_held_folder_and_takes_over_after_sigkill(tmp_path, caplog):
    folder = tmp_path / "run"
    folder.mkdir()
    holder = hold(folder)
    try:
        record = (folder / LOCK_NAME).read_text()
        assert json.loads(record)["pid"] == holder.pid and json.loads(record)["host"] == socket.gethostname()
        with pytest.raises(RunFolderBusy, match=rf"{folder} is in use by pid {holder.pid} on .* since \d{{4}}-"):
            claim(folder)
        # run() (the Python API) claims before it touches the folder
        (folder / "config_resolved.yaml").write_text("")  # a run folder, as far as the resolver can tell
        with pytest.raises(RunFolderBusy):
            run(compose_cfg(FAST + ["eval.tasks=false", "trainer.resume=true"]), folder)
        assert sorted(p.name for p in folder.iterdir()) == ["config_resolved.yaml", LOCK_NAME]
        assert (folder / LOCK_NAME).read_text() == record  # read, never written
    finally:
        holder.kill()
        holder.wait()
    assert claim(folder) is True and claim(folder) is False  # the kernel let go with the process; ours once
    try:
        with caplog.at_level(logging.WARNING, logger="biencoder"):
            announce_lock(folder)
            announce_lock(folder)  # said once
        stale = [r.getMessage() for r in caplog.records if "took over a stale lock" in r.getMessage()]
        assert len(stale) == 1 and f"pid {holder.pid}" in stale[0]
        assert json.loads((folder / LOCK_NAME).read_text())["pid"] == os.getpid()
    finally:
        release(folder)
    assert (folder / LOCK_NAME).read_text() == ""  # a clean end: the next holder takes over nothing
    assert claim(folder) is True
    release(folder)


def test_only_rank_zero_claims_under_torchrun(tmp_path, monkeypatch):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "last.pt").write_bytes(b"")
    monkeypatch.setenv("RANK", "1")
    run_dir_resolver(str(folder), str(tmp_path / "new"))
    assert not (folder / LOCK_NAME).exists()
    monkeypatch.setenv("RANK", "0")
    run_dir_resolver(str(folder), str(tmp_path / "new"))
    try:
        assert json.loads((folder / LOCK_NAME).read_text())["pid"] == os.getpid()
    finally:
        release(folder)


def test_the_bad_input_clean_up_removes_a_lock_file_only_if_this_process_made_it(tmp_path):
    """A run folder from before locks existed gets run.lock from this process, which removes it again with Hydra's
    files; a run.lock that was there is kept (another process may have it open)."""
    old, new = tmp_path / "old", tmp_path / "new"
    for folder in (old, new):
        folder.mkdir()
        (folder / "last.pt").write_bytes(b"")
    (new / LOCK_NAME).write_text("")
    for folder in (old, new):
        new_dir_resolver(folder)  # as the resolver notes it, before anything is written
        claim(folder)
        discard_if_ours(folder)
        release(folder)
    assert sorted(p.name for p in old.iterdir()) == ["last.pt"]
    assert sorted(p.name for p in new.iterdir()) == ["last.pt", LOCK_NAME]
