"""DDP on the CPU: torchrun with 2 gloo processes trains one run; rank 0 alone mines, evaluates and writes."""

import json
import os
import socket
import subprocess
import sys

from biencoder.state import read_metrics
from conftest import REPO

ARGS = ["model=tiny", "trainer.progress=false", "trainer.max_epochs=2", "trainer.batch_size=8", "+variant=ln",
        "trainer.keep_last=true"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_gloo_processes_write_one_run(tmp_path):
    logs = tmp_path / "logs"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
           f"--master_port={free_port()}", "-m", "biencoder.train", *ARGS, f"paths.log_dir={logs}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    folders = [p for p in (logs / "runs").iterdir()]
    assert len(folders) == 1, folders  # rank 1 works in rank 0's folder and leaves none of its own
    out = folders[0]
    rows, torn = read_metrics(out / "metrics.jsonl")
    assert not torn
    assert [(r["epoch"], r["split"]) for r in rows] == [(e, s) for e in (0, 1) for s in ("train", "val", "test")]
    # every query evaluated once, by rank 0 (data.dedup drops 2 demo pairs from train and val)
    assert [r["queries"] for r in rows] == [30, 30, 32] * 2
    final = json.loads((out / "final.json").read_text())
    assert final["status"] == "done" and final["best_epoch"] in (0, 1)
    assert "(2 processes)" in (out / "train.log").read_text()
    assert (out / "train.log").read_text().count("epoch 1  loss") == 1  # one rank logs
    import torch

    state = torch.load(out / "last.pt", weights_only=True)
    assert isinstance(state["rng"], list) and len(state["rng"]) == 2  # each rank resumes its own RNG streams
