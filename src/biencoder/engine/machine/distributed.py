"""DistributedDataParallel plumbing for ``torchrun --nproc_per_node=N -m biencoder.train ...``.

torchrun sets ``WORLD_SIZE``/``RANK``/``LOCAL_RANK``; with more than one process the group is started with the
backend :func:`biencoder.engine.machine.runtime.decide` chose (NCCL on CUDA, gloo on the CPU). Rank 0 mines,
evaluates and writes every file; the others train on their shard of the triplets and receive each epoch's
negatives by broadcast.
Without torchrun every helper is a no-op.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from .runtime import Runtime


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def is_main() -> bool:
    return rank() == 0


def setup(runtime: Runtime) -> None:
    """Start the process group that :func:`biencoder.engine.machine.runtime.decide` chose (``runtime.backend``; None:
    one process, nothing to start). On CUDA each process first takes the GPU of its ``LOCAL_RANK``
    (``runtime.device``)."""
    if runtime.backend is None or dist.is_initialized():
        return
    if runtime.device.type == "cuda":
        torch.cuda.set_device(runtime.device)
    dist.init_process_group(backend=runtime.backend)


def teardown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def barrier() -> None:
    if world_size() > 1:
        dist.barrier()


def broadcast_rows(rows: np.ndarray | None, n: int) -> np.ndarray:
    """Rank 0's int64 array [n] on every rank (the others pass None)."""
    if world_size() == 1:
        return rows
    backend_device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    tensor = torch.from_numpy(np.asarray(rows, dtype=np.int64)) if is_main() else torch.empty(n, dtype=torch.int64)
    tensor = tensor.to(backend_device)
    dist.broadcast(tensor, src=0)
    return tensor.cpu().numpy()


def broadcast_object(obj):
    """Rank 0's picklable object on every rank."""
    if world_size() == 1:
        return obj
    box = [obj if is_main() else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def all_gather_object(obj) -> list:
    """Every rank's picklable ``obj``, in rank order, on every rank (``[obj]`` without DDP)."""
    if world_size() == 1:
        return [obj]
    out = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def mean_over_ranks(values: dict[str, float]) -> dict[str, float]:
    """The mean of each value over all ranks (the same keys on every rank)."""
    if world_size() == 1 or not values:
        return values
    keys = sorted(values)
    backend_device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    tensor = torch.tensor([values[k] for k in keys], dtype=torch.float64, device=backend_device)
    dist.all_reduce(tensor)
    return dict(zip(keys, (tensor / world_size()).tolist(), strict=True))
