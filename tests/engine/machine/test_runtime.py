"""The start-up decision (device, precision, backend, determinism), with the CUDA device count faked so that every
branch runs on a CPU, and what a run records of it."""

import json
import logging
import os
import subprocess
import sys

import pytest
import torch

from biencoder.engine.machine.runtime import Runtime, decide, nondeterministic_op, set_cublas_workspace
from biencoder.errors import ConfigError
from conftest import REPO

TORCHRUN_2 = {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"}


@pytest.fixture
def gpus(monkeypatch):
    """``gpus(n, bf16=True)``: torch reports n visible CUDA devices (n=0: none) from now on in this test."""

    def fake(n: int, bf16: bool = True):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: bf16)

    return fake


@pytest.mark.parametrize(
    "n_gpus, device, precision, env, expect",
    [
        (0, "auto", "auto", {}, ("cpu", "fp32", None)),
        (1, "auto", "auto", {}, ("cuda:0", "bf16", None)),
        (1, "cpu", "auto", {}, ("cpu", "fp32", None)),  # asked for the CPU: it gets it
        (1, "cuda", "fp32", {}, ("cuda:0", "fp32", None)),
        (0, "auto", "bf16", {}, ("cpu", "bf16", None)),  # bf16 autocast on the CPU when asked
        (2, "auto", "auto", TORCHRUN_2, ("cuda:1", "bf16", "nccl")),  # each process its LOCAL_RANK's GPU
        (1, "cpu", "auto", TORCHRUN_2, ("cpu", "fp32", "gloo")),  # gloo even with CUDA visible
        (0, "auto", "auto", TORCHRUN_2, ("cpu", "fp32", "gloo")),
        # two nodes of two GPUs: rank 3 is the second process of the second node
        (
            2,
            "auto",
            "auto",
            {"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "RANK": "3", "LOCAL_RANK": "1"},
            ("cuda:1", "bf16", "nccl"),
        ),
    ],
)
def test_the_decision(gpus, n_gpus, device, precision, env, expect):
    gpus(n_gpus)
    runtime = decide(device, precision, environ=env)
    assert (str(runtime.device), runtime.precision, runtime.backend) == expect
    assert runtime.autocast_dtype == (torch.bfloat16 if expect[1] == "bf16" else None)
    assert runtime.world_size == int(env.get("WORLD_SIZE", 1)) and runtime.local_rank == int(env.get("LOCAL_RANK", 0))


def test_auto_precision_is_fp32_on_a_gpu_without_native_bf16(gpus):
    gpus(1, bf16=False)
    assert decide("auto", "auto", environ={}).precision == "fp32"
    assert decide("auto", "bf16", environ={}).precision == "bf16"  # asked for: given


@pytest.mark.parametrize("native", [True, False])
def test_auto_precision_on_a_torch_whose_bf16_check_takes_no_argument(gpus, monkeypatch, native):
    """torch < 2.4: ``is_bf16_supported()`` has no ``including_emulation`` and reports native support only."""
    gpus(1)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: native)
    assert decide("auto", "auto", environ={}).precision == ("bf16" if native else "fp32")


@pytest.mark.parametrize("env", [TORCHRUN_2, {**TORCHRUN_2, "RANK": "0", "LOCAL_RANK": "0"}])
def test_more_processes_than_gpus_is_one_line_naming_both_counts_and_the_fixes(gpus, env):
    gpus(1)
    with pytest.raises(ConfigError) as err:
        decide("auto", "auto", environ=env)  # every rank refuses, rank 0 too: none waits for the others
    message = str(err.value)
    assert "\n" not in message
    assert "2 processes" in message and "1 CUDA device is visible" in message
    assert "--nproc_per_node=1" in message and "trainer.device=cpu" in message


def test_cuda_without_a_gpu_and_bad_values_are_refused(gpus):
    gpus(0)
    with pytest.raises(ConfigError, match=r"trainer\.device=cuda but no CUDA device"):
        decide("cuda", "auto", environ={})
    with pytest.raises(ConfigError, match=r"trainer\.precision='fp16'"):
        decide("auto", "fp16", environ={})


def test_the_record():
    runtime = Runtime(torch.device("cpu"), "fp32", deterministic=True, world_size=2)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)  # the thread count of the moment: it moves a CPU run's last digits
        assert runtime.record() == {
            "device": "cpu",
            "device_name": "cpu",
            "precision": "fp32",
            "deterministic": True,
            "processes": 2,
            "cpu_threads": 1,
        }
    finally:
        torch.set_num_threads(before)


def test_deterministic_sets_the_torch_switches_and_cublas_workspace(global_determinism):
    torch.backends.cudnn.benchmark = True
    Runtime(torch.device("cpu"), "fp32", deterministic=True).apply()
    assert torch.are_deterministic_algorithms_enabled()
    assert torch.backends.cudnn.deterministic is True and torch.backends.cudnn.benchmark is False
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    # a second run in the same process without the flag does not inherit it
    Runtime(torch.device("cpu"), "fp32", deterministic=False).apply()
    assert not torch.are_deterministic_algorithms_enabled() and torch.backends.cudnn.deterministic is False


def test_a_deterministic_cublas_setting_of_the_user_is_kept(monkeypatch):
    env = {"CUBLAS_WORKSPACE_CONFIG": ":16:8"}
    set_cublas_workspace(env)
    assert env == {"CUBLAS_WORKSPACE_CONFIG": ":16:8"}


def test_cuda_started_before_the_setting_is_said_in_one_line(monkeypatch, caplog):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    env = {"CUBLAS_WORKSPACE_CONFIG": ":0:0"}
    with caplog.at_level(logging.WARNING, logger="biencoder"):
        set_cublas_workspace(env)
    assert env["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    (record,) = caplog.records
    assert "\n" not in record.getMessage() and ":0:0" in record.getMessage()
    assert "export CUBLAS_WORKSPACE_CONFIG=:4096:8" in record.getMessage()


def test_torchs_error_for_an_operation_without_a_deterministic_kernel_is_named(global_determinism):
    torch.use_deterministic_algorithms(True)
    with pytest.raises(RuntimeError) as err:  # max_unpool has no deterministic kernel, on the CPU either
        torch.nn.functional.max_unpool1d(torch.ones(1, 1, 2), torch.tensor([[[0, 1]]]), 2)
    wrapped = RuntimeError("while compiling")
    wrapped.__cause__ = err.value
    for raised in (err.value, wrapped):
        named = nondeterministic_op(raised, "cuda")
        assert str(named).startswith("max_unpooling2d_forward_out has no deterministic implementation on cuda")
        assert "trainer.deterministic=false" in str(named) and "\n" not in str(named)
    assert nondeterministic_op(RuntimeError("CUDA out of memory"), "cuda") is None


@pytest.mark.slow
def test_cli_an_operation_without_a_deterministic_kernel_is_one_line_exit_2(tmp_path):
    """A training step that meets such an operation under trainer.deterministic=true: one error line naming it,
    exit 2, no traceback, no run folder (it trained nothing)."""
    wrapper = tmp_path / "unpool_step.py"
    wrapper.write_text(
        "import torch\n"
        "from biencoder import train\nfrom biencoder.engine.training import triplets\n"
        "forward = triplets.TripletStep.forward\n"
        "def with_unpool(self, *args, **kwargs):\n"
        "    torch.nn.functional.max_unpool1d(torch.ones(1, 1, 2), torch.tensor([[[0, 1]]]), 2)\n"
        "    return forward(self, *args, **kwargs)\n"
        "triplets.TripletStep.forward = with_unpool\n"
        "train.cli()\n"
    )
    logs = tmp_path / "logs"
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    proc = subprocess.run(
        [
            sys.executable,
            str(wrapper),
            "model=tiny",
            "trainer.progress=false",
            "trainer.max_epochs=1",
            "eval.tasks=false",
            "trainer.deterministic=true",
            f"paths.log_dir={logs}",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "max_unpooling2d_forward_out has no deterministic implementation" in errors[0]
    assert not (logs / "runs").exists()  # the folder and the empty parents made for it are gone


@pytest.mark.slow
def test_the_record_in_final_json_and_config_resolved(tmp_path, global_determinism):
    import yaml

    from biencoder.engine.training.run import run
    from conftest import compose_cfg

    final = run(
        compose_cfg(
            [
                "model=tiny",
                "trainer.progress=false",
                "trainer.max_epochs=1",
                "eval.tasks=false",
                "trainer.deterministic=true",
            ]
        ),
        tmp_path,
    )
    expected = {
        "device": "cpu",
        "device_name": "cpu",
        "precision": "fp32",
        "deterministic": True,
        "processes": 1,
        "cpu_threads": torch.get_num_threads(),
    }
    assert final["runtime"] == expected == json.loads((tmp_path / "final.json").read_text())["runtime"]
    saved = yaml.safe_load((tmp_path / "config_resolved.yaml").read_text())
    assert saved["runtime"] == expected
    # auto, resolved: what the summaries group by and what a resume is checked against
    assert (saved["trainer"]["device"], saved["trainer"]["precision"], saved["trainer"]["deterministic"]) == (
        "cpu",
        "fp32",
        True,
    )
    assert saved["eval"]["pair_batch_size"] == 256  # null in the config: the CPU's block size, as used
    threads = torch.get_num_threads()
    assert (
        f"on cpu (fp32, deterministic, 1 process, {threads} CPU thread{'s' if threads > 1 else ''})"
        in (tmp_path / "train.log").read_text()
    )


@pytest.mark.parametrize("device", ["auto", "cuda"])
def test_deterministic_sets_cublas_before_anything_asks_cuda(global_determinism, monkeypatch, device):
    """trainer.deterministic=true, precision=auto on a (faked) GPU: every CUDA query of the start-up, the bf16 check
    (which starts CUDA on a real GPU) included, sees CUBLAS_WORKSPACE_CONFIG set already; cuBLAS reads it once."""
    from biencoder.engine.training.runner import decide_runtime
    from conftest import compose_cfg

    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", "")  # so that monkeypatch removes what the start-up sets
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
    seen = []

    def fake(name, value):
        def call(*args, **kwargs):
            seen.append((name, os.environ.get("CUBLAS_WORKSPACE_CONFIG")))
            return value

        monkeypatch.setattr(torch.cuda, name, call)

    for name, value in [
        ("is_available", True),
        ("device_count", 1),
        ("is_bf16_supported", True),
        ("init", None),
        ("current_device", 0),
        ("get_device_capability", (9, 0)),
        ("get_device_name", "fake GPU"),
        ("get_device_properties", None),
        ("_lazy_init", None),
    ]:
        fake(name, value)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    cfg = compose_cfg(["trainer.deterministic=true", "trainer.precision=auto", f"trainer.device={device}"])
    runtime = decide_runtime(cfg)
    assert (str(runtime.device), runtime.precision, runtime.deterministic) == ("cuda:0", "bf16", True)
    assert "is_bf16_supported" in {name for name, _ in seen}
    assert seen and all(value == ":4096:8" for _, value in seen), seen
