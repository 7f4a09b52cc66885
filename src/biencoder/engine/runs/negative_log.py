"""``negatives.log=true``: each epoch's mined negatives in the run folder, as ``negatives/epoch_<NNN>.npz``
(:func:`~biencoder.engine.retrieval.negative_record.negatives_record`: per training pair the negative's row, whether it
is random, its rank, its distance and the positive's, whether it is another pair's counter). Written whole (temp file,
then rename); an epoch run again (a resume) writes its file again. Read back by :func:`read_negative_log`
(``biencoder-corpus negatives``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..files import save_npz_atomic
from ..retrieval.negative_record import negatives_record
from ..retrieval.negatives import MinedNegatives

#: the folder of a run's records, one ``epoch_<NNN>.npz`` per epoch
NEGATIVES_DIR = "negatives"


def negatives_file(run: str | Path, epoch: int) -> Path:
    """Where epoch ``epoch``'s record goes in the run folder ``run``."""
    return Path(run) / NEGATIVES_DIR / f"epoch_{epoch:03d}.npz"


def log_negatives(run: str | Path, epoch: int, train_sim: torch.Tensor, trainer, negatives: MinedNegatives) -> Path:
    """Epoch ``epoch``'s ``negatives`` (mined by ``trainer``, an
    :class:`~biencoder.engine.training.epoch.EpochTrainer`, from the training split's sim vectors ``train_sim``)
    into the run folder ``run``; returns the file."""
    path = negatives_file(run, epoch)
    path.parent.mkdir(exist_ok=True)
    save_npz_atomic(path, negatives_record(train_sim.numpy(), trainer.split, negatives))
    return path


def read_negative_log(run: str | Path) -> list[tuple[int, dict[str, np.ndarray]]]:
    """(epoch, record) per ``negatives/epoch_<NNN>.npz`` of the run folder ``run``, in epoch order; empty when the
    run kept none."""
    out = []
    for file in sorted((Path(run) / NEGATIVES_DIR).glob("epoch_*.npz")):
        with np.load(file) as data:
            out.append((int(file.stem.split("_")[1]), {key: data[key] for key in data.files}))
    return out
