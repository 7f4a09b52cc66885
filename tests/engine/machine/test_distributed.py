"""DDP on the CPU: torchrun with 2 gloo processes trains one run; rank 0 alone mines, evaluates and writes. The
multi-node recipe (c10d rendezvous) as far as one machine allows, and the one-line refusal of more processes than
GPUs (with the GPU count faked)."""

import json
import os
import socket
import subprocess
import sys

import pytest

from biencoder.engine.runs.records import read_metrics
from conftest import REPO

# trainer.device=cpu: gloo, even on a machine with CUDA (auto would take the GPUs, one per process)
ARGS = [
    "model=tiny",
    "trainer.progress=false",
    "trainer.max_epochs=2",
    "trainer.batch_size=8",
    "+variant=ln",
    "trainer.keep_last=true",
    "trainer.device=cpu",
]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_one_run(logs, processes: int = 2):
    """The single run folder two processes trained together."""
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
    threads = final["runtime"].pop("cpu_threads")  # torchrun's OMP_NUM_THREADS: 1 unless set
    assert final["runtime"] == {
        "device": "cpu",
        "device_name": "cpu",
        "precision": "fp32",
        "deterministic": False,
        "processes": processes,
    }
    assert f"on cpu (fp32, {processes} processes, {threads} CPU thread" in (out / "train.log").read_text()
    assert (out / "train.log").read_text().count("epoch 1  loss") == 1  # one rank logs
    import torch

    state = torch.load(out / "last.pt", weights_only=True)
    assert isinstance(state["rng"], list) and len(state["rng"]) == processes  # each rank resumes its own RNG streams
    return final


@pytest.mark.slow
def test_two_gloo_processes_write_one_run(tmp_path):
    """One node, two processes, the c10d rendezvous of the multi-node recipe (README)."""
    logs = tmp_path / "logs"
    cmd = [
        *TORCHRUN,
        "--nnodes=1",
        "--nproc_per_node=2",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{free_port()}",
        "-m",
        "biencoder.train",
        *ARGS,
        f"paths.log_dir={logs}",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    check_one_run(logs)


@pytest.mark.slow
def test_two_nodes_meet_at_a_c10d_rendezvous(tmp_path):
    """``torchrun --nnodes=2 --rdzv-backend=c10d --rdzv-endpoint=<host>:<port>`` started twice, as on two machines
    (here both on this one, one gloo process each): they train one run together."""
    logs = tmp_path / "logs"
    endpoint = f"127.0.0.1:{free_port()}"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    nodes = [
        subprocess.Popen(
            [
                *TORCHRUN,
                "--nnodes=2",
                "--nproc_per_node=1",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint={endpoint}",
                "--rdzv-id=biencoder-test",
                f"--rdzv-conf=is_host={'true' if node == 0 else 'false'}",
                "-m",
                "biencoder.train",
                *ARGS,
                f"paths.log_dir={logs}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=REPO,
        )
        for node in (0, 1)
    ]
    outputs = [node.communicate(timeout=300) for node in nodes]
    for node, (_, err) in zip(nodes, outputs, strict=True):
        assert node.returncode == 0, err[-3000:]
    check_one_run(logs)


@pytest.mark.slow
def test_more_processes_than_gpus_is_one_line_and_no_folder(tmp_path):
    """``torchrun --nproc_per_node=2`` on a machine whose torch reports one CUDA device: every rank stops with the
    same line naming both counts and the fixes, exit code 2, and no run folder is left."""
    one_gpu = tmp_path / "one_gpu.py"
    one_gpu.write_text(
        "import torch\n"
        "torch.cuda.is_available = lambda: True\n"
        "torch.cuda.device_count = lambda: 1\n"
        "from biencoder.train import cli\n"
        "cli()\n"
    )
    logs = tmp_path / "logs"
    # a monitor interval of 2 s: torchrun stops the other rank only after it has had time to clean up after itself
    cmd = [
        *TORCHRUN,
        "--nproc_per_node=2",
        "--monitor-interval=2",
        "--master_addr=127.0.0.1",
        f"--master_port={free_port()}",
        str(one_gpu),
        "model=tiny",
        "trainer.progress=false",
        f"paths.log_dir={logs}",
    ]
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env={**env, "OMP_NUM_THREADS": "1"}, cwd=REPO, timeout=300
    )
    assert proc.returncode != 0
    assert "exitcode  : 2" in proc.stderr  # torchrun's report of its processes
    errors = {line for line in proc.stderr.splitlines() if line.startswith("error:")}
    assert errors == {
        "error: torchrun started 2 processes on this node but 1 CUDA device is visible (one per process "
        "is needed): start torchrun --nproc_per_node=1, or train with gloo on the CPU "
        "(trainer.device=cpu)"
    }
    # no run folder is left. Each rank removes its own folder and the empty parents it made; the rank that made
    # logs/runs may find the other rank's folder still in it, and the other did not make it, so an empty logs/runs
    # can stay (it did in 2 of 6 runs on 2026-11-24): the rule is "remove only what this process created"
    assert not (logs / "runs").exists() or not any((logs / "runs").iterdir())


@pytest.mark.slow
@pytest.mark.parametrize("existing", [False, True])
def test_a_rank_stopped_by_torchrun_during_start_up_leaves_nothing_of_its_own(tmp_path, existing):
    """torchrun stops (SIGTERM) the other ranks as soon as one fails; a rank still in start-up then removes what it
    made of its folder, as its own error would (the folder it created, or in a folder that was there only Hydra's
    files), and dies of the signal as before. Deterministic here: start-up sends the SIGTERM to its own process
    (WORLD_SIZE=2, no torchrun)."""
    stopped = tmp_path / "stopped.py"
    stopped.write_text(
        "import os, signal\n"
        "import biencoder.train as train\n"
        "train.decide_runtime = lambda cfg: os.kill(os.getpid(), signal.SIGTERM)\n"
        "train.cli()\n"
    )
    run_dir = tmp_path / "logs" / "runs" / "r1"
    if existing:
        run_dir.mkdir(parents=True)
        (run_dir / "notes.txt").write_text("mine")
    env = {**{k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}, "WORLD_SIZE": "2"}
    proc = subprocess.run(
        [sys.executable, str(stopped), "model=tiny", f"hydra.run.dir={run_dir}"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=300,
    )
    assert proc.returncode == -15, proc.stderr
    if existing:
        assert sorted(p.name for p in run_dir.rglob("*")) == ["notes.txt"]
    else:
        assert not (tmp_path / "logs").exists()


def wait_for(condition, what: str, timeout: float) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {timeout:.0f} s"
        time.sleep(0.1)


def accepts_connections(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


@pytest.mark.slow
def test_a_rank_waiting_in_the_rendezvous_ends_at_once_on_sigterm(tmp_path):
    """From the process group's rendezvous on, SIGTERM ends the rank at once, as it always did: a Python handler
    cannot run while the main thread waits in C++, and torchrun would wait 30 s, then SIGKILL it. Rank 0 of 2 here,
    with no rank 1: it waits in the rendezvous until it is stopped. The signal is sent only once the rank has called
    ``init_process_group`` (a marker file its wrapper writes) and its store listens (rank 0 then waits for rank 1)."""
    import signal

    run_dir, marker, port = tmp_path / "run", tmp_path / "in_rendezvous", free_port()
    wrapper = tmp_path / "rank0.py"
    wrapper.write_text(
        "import pathlib, sys\n"
        "import torch.distributed as dist\n"
        "import biencoder.train as train\n"
        "marker, start = pathlib.Path(sys.argv.pop(1)), dist.init_process_group\n"
        "def entering(*args, **kwargs):\n"
        "    marker.write_text('entered')\n"
        "    return start(*args, **kwargs)\n"
        "dist.init_process_group = entering\n"
        "train.cli()\n"
    )
    env = {
        **{k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"},
        "WORLD_SIZE": "2",
        "RANK": "0",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }
    proc = subprocess.Popen(
        [sys.executable, str(wrapper), str(marker), "model=tiny", "trainer.device=cpu", f"hydra.run.dir={run_dir}"],
        env=env,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: marker.exists() or proc.poll() is not None, "the rank calls init_process_group", 180)
        wait_for(lambda: accepts_connections(port) or proc.poll() is not None, "the rank's store listens", 60)
        assert proc.poll() is None  # waiting for rank 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == -15
    finally:
        proc.kill()
        proc.wait()


# a BatchNorm head under DDP: each process normalises its own batch, and the running statistics are rank 0's (DDP
# broadcasts module buffers from rank 0 before every forward), so every rank starts each step from the same ones
BATCHNORM_RANKS = """
import copy, json, pathlib, sys
from types import SimpleNamespace
import torch, torch.distributed as dist
from transformers import BertConfig, BertModel
from biencoder.engine.config.heads import head_spec
from biencoder.engine.modeling.loss import TripletCELoss
from biencoder.engine.modeling.model import BiModel
from biencoder.engine.training.epoch import EpochTrainer
from biencoder.engine.training.triplets import TripletStep

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
encoder = BertModel(BertConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8))
encoder.requires_grad_(False)  # frozen, as a run with model.encoder.freeze=true holds it
model = BiModel(encoder, sim_dim=4, head=head_spec({"norm": "batchnorm"})).train()
alone = copy.deepcopy(model)  # the same weights, outside DDP: what this process's batch alone gives
settings = SimpleNamespace(compile=False, pooling="mean")  # what _step_module reads of TrainingSettings
trainer = SimpleNamespace(frozen=True, device=torch.device("cpu"), settings=settings)
step = EpochTrainer._step_module(trainer, TripletStep(model, TripletCELoss()))
bn = model.head.norm
batches = [torch.Generator().manual_seed(10 * rank + i) for i in range(2)]
pooled = [torch.randn(3 * 4, 8, generator=g) * (1 + rank) + rank for g in batches]
first = step(pooled=pooled[0])
first.total.backward()
own = TripletStep(alone, TripletCELoss())(pooled=pooled[0])
after_first = [bn.running_mean.clone() for _ in range(2)]
dist.all_gather(after_first, bn.running_mean.clone())
second = step(pooled=pooled[1])
update = 0.1 * second.head_pre.mean(0)  # momentum 0.1: what this rank's second batch adds to the mean it starts from
report = {
    "own_batch": torch.allclose(first.head_post, own.head_post, atol=1e-6),
    "ranks_differ_after_first": not torch.allclose(after_first[0], after_first[1]),
    "second_from_rank0": torch.allclose(bn.running_mean, 0.9 * after_first[0] + update, atol=1e-6),
    "second_from_own": torch.allclose(bn.running_mean, 0.9 * after_first[rank] + update, atol=1e-6),
}
(pathlib.Path(sys.argv[1]) / f"report{rank}.json").write_text(json.dumps(report))  # one file per rank, whole
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_a_batchnorm_head_normalises_each_process_batch_and_keeps_rank_0_s_running_statistics(tmp_path):
    """Two gloo processes, the training step wrapped as a run wraps it (EpochTrainer._step_module): each rank's
    BatchNorm output is that of its own batch alone (not SyncBatchNorm's over both batches), and the second step of
    rank 1 updates rank 0's running statistics, not its own (DDP's buffer broadcast): so the statistics that rank 0
    evaluates with and saves are the ones every rank trains from."""
    script = tmp_path / "ranks.py"
    script.write_text(BATCHNORM_RANKS)
    cmd = [*TORCHRUN, "--nproc_per_node=2", "--master_addr=127.0.0.1", f"--master_port={free_port()}", str(script)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([*cmd, str(tmp_path)], capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in ("0", "1"):
        report = json.loads((tmp_path / f"report{rank}.json").read_text())
        assert report["own_batch"] and report["ranks_differ_after_first"] and report["second_from_rank0"], report
        assert report["second_from_own"] == (rank == "0"), report


@pytest.mark.slow
def test_two_gloo_processes_train_a_head_with_hidden_layer_batchnorm_and_dropout(tmp_path):
    """The whole run under DDP with every kind of head part at once: it trains, evaluates and writes one run whose
    best.pt holds the BatchNorm's running statistics."""
    logs = tmp_path / "logs"
    head = [
        "model.head.norm=batchnorm",
        "model.head.activation=gelu",
        "model.head.hidden=[16]",
        "model.head.dropout=0.1",
    ]
    args = [a for a in ARGS if not a.startswith("+variant")] + head
    cmd = [*TORCHRUN, "--nproc_per_node=2", "--master_addr=127.0.0.1", f"--master_port={free_port()}"]
    cmd += ["-m", "biencoder.train", *args, f"paths.log_dir={logs}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    check_one_run(logs)
    (out,) = (logs / "runs").iterdir()
    assert out.name.endswith("_h16_batchnorm_gelu_drop0.1_s0")
    import torch

    state = torch.load(out / "best.pt", weights_only=True)["state_dict"]
    assert int(state["head.norm.num_batches_tracked"]) > 0 and "head.hidden.0.linear.weight" in state
