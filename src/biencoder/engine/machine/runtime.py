"""Where and how a process computes: device, precision, distributed backend, determinism and seeds, decided once.

:func:`decide` reads ``trainer.device``, ``trainer.precision``, ``trainer.deterministic`` and torchrun's
environment (``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``) at start-up and returns a :class:`Runtime`;
everything else (the process group, the runner, the evaluation app, the run record) receives that answer instead
of asking torch again. Hydra-free: the apps pass the three config values in.
"""

from __future__ import annotations

import logging
import os
import random
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from ...errors import ConfigError
from ..config.schema import DEVICES, PRECISIONS, TrainerSchema

log = logging.getLogger("biencoder")

#: cuBLAS workspace settings under which cuBLAS is deterministic (NVIDIA's cuBLAS docs, "Results reproducibility")
DETERMINISTIC_CUBLAS = (":4096:8", ":16:8")
#: how torch words the error of an operation without a deterministic kernel (``torch.use_deterministic_algorithms``)
_NO_DETERMINISTIC_KERNEL = re.compile(r"(\S+) does not have a deterministic implementation")


class NonDeterministicOp(RuntimeError):
    """An operation without a deterministic kernel ran under ``trainer.deterministic=true``."""

    def __init__(self, op: str, device: str):
        super().__init__(
            f"{op} has no deterministic implementation on {device}, and trainer.deterministic=true "
            "asks for one: run with trainer.deterministic=false (results may then vary between runs), "
            "or on the CPU (trainer.device=cpu)"
        )


@dataclass(frozen=True)
class Runtime:
    """One process's answer to "where and how does it compute".

    Attributes:
        device: ``cpu`` or ``cuda:<local rank>``.
        precision: the precision actually used, ``fp32`` or ``bf16`` (autocast), never ``auto``.
        deterministic: torch's deterministic algorithms are on (:meth:`apply`).
        backend: ``nccl`` or ``gloo`` when torchrun started several processes, else None.
        local_rank, world_size: from torchrun's environment (0 and 1 without it).
    """

    device: torch.device
    precision: str
    deterministic: bool = TrainerSchema.deterministic
    backend: str | None = None
    local_rank: int = 0
    world_size: int = 1

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        """The dtype for ``torch.autocast``, or None: no autocast (fp32)."""
        return torch.bfloat16 if self.precision == "bf16" else None

    @property
    def device_name(self) -> str:
        """``cpu``, or the GPU's name as CUDA reports it (e.g. ``NVIDIA H100 80GB HBM3``)."""
        return torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu"

    def describe(self, processes: int, threads: int) -> str:
        """The machine as a run's first log line names it: the GPU, the precision, deterministic or not, the
        ``processes`` and (on a CPU) the torch ``threads``."""
        how = (
            ([self.device_name] if self.device.type == "cuda" else [])
            + [self.precision]
            + (["deterministic"] if self.deterministic else [])
            + [f"{processes} process{'es' if processes > 1 else ''}"]
            + ([f"{threads} CPU thread{'s' if threads > 1 else ''}"] if self.device.type == "cpu" else [])
        )
        return ", ".join(how)

    def pair_batch_size(self, configured: int | None) -> int:
        """Pairs per classifier call (and rows per sim-head call) in evaluation: ``eval.pair_batch_size``, or by device
        when it is null (:func:`pair_batch_size`)."""
        return pair_batch_size(self.device, configured)

    def eval_batch_size(self, configured: int | None) -> int:
        """Texts per encoder forward when a split is embedded: ``trainer.eval_batch_size``, or by device when it is
        null (:func:`eval_batch_size`)."""
        return eval_batch_size(self.device, configured)

    def record(self) -> dict:
        """What the run record (``final.json``) states about the process that computed it. ``cpu_threads`` (torch's
        intra-op threads, ``OMP_NUM_THREADS``): on a CPU another count splits the sums differently, so same-seed
        numbers agree to the last digit only at the same count (docs/reproducibility.md)."""
        return {
            "device": self.device.type,
            "device_name": self.device_name,
            "precision": self.precision,
            "deterministic": self.deterministic,
            "processes": self.world_size,
            "cpu_threads": torch.get_num_threads(),
        }

    def apply(self) -> None:
        """Set torch's global determinism switches to ``deterministic`` (both ways, so a second run in the same
        process does not inherit the first one's). Call before any CUDA work: cuBLAS reads its workspace setting
        when it starts."""
        if self.deterministic:
            set_cublas_workspace()
        torch.use_deterministic_algorithms(self.deterministic)
        torch.backends.cudnn.deterministic = self.deterministic
        if self.deterministic:
            torch.backends.cudnn.benchmark = False  # benchmarking picks the fastest kernel per run, not the same one


def pair_batch_size(device: torch.device, configured: int | None = None) -> int:
    """Pairs per classifier call (and rows per sim-head call) in evaluation on ``device``: ``configured``, or by device
    when it is None. On a CPU 256: a [256, 1536] block of pair features stays in cache through the LayerNorm, ReLU and
    output layer, with the same margins to the bit as larger blocks (BENCHMARKS.md, "Tried and rejected"). On a GPU
    4096, what the H100 runs of RESULTS.md used (fewer, larger launches)."""
    if configured is not None:
        return int(configured)
    return 4096 if device.type == "cuda" else 256


def eval_batch_size(device: torch.device, configured: int | None = None) -> int:
    """Texts per encoder forward when texts are embedded in eval mode on ``device``: ``configured``, or by device when
    it is None. On a CPU 64: what every CPU run has embedded with, so its vectors and metrics stay the same to the
    bit (the batch size decides which rows pad together, and BLAS rounds by shape). On a GPU 512: fewer, larger
    launches (ArguAna's three splits, 10 514 texts, in 22 forwards instead of 166); the vectors are kept on the
    device, so a batch costs no host sync either way."""
    if configured is not None:
        return int(configured)
    return 512 if device.type == "cuda" else 64


def set_cublas_workspace(environ: os._Environ | dict | None = None) -> None:
    """``CUBLAS_WORKSPACE_CONFIG=:4096:8`` unless a deterministic value is set already; says so in one log line when
    CUDA started earlier in this process with another value (cuBLAS may then keep it)."""
    environ = os.environ if environ is None else environ
    old = environ.get("CUBLAS_WORKSPACE_CONFIG")
    if old in DETERMINISTIC_CUBLAS:
        return
    environ["CUBLAS_WORKSPACE_CONFIG"] = DETERMINISTIC_CUBLAS[0]
    if torch.cuda.is_initialized():
        log.warning(
            "CUDA started in this process with CUBLAS_WORKSPACE_CONFIG=%s; set to %s now, cuBLAS may not "
            "follow: export CUBLAS_WORKSPACE_CONFIG=%s before starting Python",
            old or "(unset)",
            DETERMINISTIC_CUBLAS[0],
            DETERMINISTIC_CUBLAS[0],
        )


def decide(
    device: str = TrainerSchema.device,
    precision: str = TrainerSchema.precision,
    deterministic: bool = TrainerSchema.deterministic,
    environ: Mapping[str, str] | None = None,
) -> Runtime:
    """The one decision of device, precision and process group; :class:`ConfigError` when it cannot work.

    Args:
        device: ``trainer.device``: ``auto`` (CUDA when visible), ``cpu`` or ``cuda``.
        precision: ``trainer.precision``: ``auto`` (bf16 autocast on a CUDA device that supports it natively,
            fp32 elsewhere), ``fp32`` or ``bf16``.
        deterministic: ``trainer.deterministic``; when true, ``CUBLAS_WORKSPACE_CONFIG`` is set in ``os.environ``
            (:func:`set_cublas_workspace`) before any question to CUDA.
        environ: torchrun's variables (default ``os.environ``): ``WORLD_SIZE`` > 1 means a process group, NCCL on
            CUDA and gloo on the CPU; on CUDA each process takes the GPU of its ``LOCAL_RANK``, so a node must not
            start more processes (``LOCAL_WORLD_SIZE``) than it has visible GPUs.
    """
    if deterministic:
        # first, before anything below can start CUDA (is_bf16_supported does): cuBLAS reads it once, when it starts
        set_cublas_workspace()
    environ = os.environ if environ is None else environ
    if device not in DEVICES:
        raise ConfigError(f"trainer.device={device!r} is not valid: use one of {', '.join(DEVICES)}")
    if precision not in PRECISIONS:
        raise ConfigError(f"trainer.precision={precision!r} is not valid: use one of {', '.join(PRECISIONS)}")
    world_size = int(environ.get("WORLD_SIZE", "1"))
    local_rank = int(environ.get("LOCAL_RANK", "0"))
    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("trainer.device=cuda but no CUDA device is visible: use trainer.device=auto or cpu")
    if use_cuda:
        visible = torch.cuda.device_count()
        local = int(environ.get("LOCAL_WORLD_SIZE", str(local_rank + 1)))
        if max(local, local_rank + 1) > visible:
            raise ConfigError(
                f"torchrun started {local} processes on this node but {visible} CUDA device"
                f"{'s are' if visible != 1 else ' is'} visible (one per process is needed): start "
                f"torchrun --nproc_per_node={visible}, or train with gloo on the CPU (trainer.device=cpu)"
            )
    if precision == "auto":
        precision = "bf16" if use_cuda and _native_bf16() else "fp32"
    return Runtime(
        device=torch.device("cuda", local_rank) if use_cuda else torch.device("cpu"),
        precision=precision,
        deterministic=bool(deterministic),
        backend=("nccl" if use_cuda else "gloo") if world_size > 1 else None,
        local_rank=local_rank,
        world_size=world_size,
    )


def _native_bf16() -> bool:
    """The visible GPU computes bf16 natively (Ampere or newer), not by emulation."""
    try:
        return torch.cuda.is_bf16_supported(including_emulation=False)
    except TypeError:  # torch < 2.4 has no such argument and counts native support only
        return torch.cuda.is_bf16_supported()


def nondeterministic_op(err: BaseException, device: str) -> NonDeterministicOp | None:
    """``err`` as a :class:`NonDeterministicOp` naming the operation, when it is torch's error for an operation
    without a deterministic kernel; else None."""
    while err is not None:  # torch.compile and DDP may wrap it
        match = _NO_DETERMINISTIC_KERNEL.search(str(err))
        if match:
            return NonDeterministicOp(match.group(1), device)
        err = err.__cause__
    return None


def set_seed_everywhere(seed: int) -> None:
    """Seed python, numpy and torch (CPU and CUDA); generators made later derive from ``seed`` too."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)


def show_progress(cfg) -> bool:
    """``trainer.progress`` of ``cfg`` (a config with ``trainer.progress``): true/false, or ``auto`` = bars only
    when stderr is a terminal (never in a log file). The app asks once and passes the answer down."""
    value = cfg.trainer.progress
    return sys.stderr.isatty() if value == "auto" else bool(value)
