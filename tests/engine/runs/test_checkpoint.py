"""Restoring ``last.pt`` (:func:`biencoder.engine.runs.checkpoint.restore_last`): a state it refuses changes
nothing."""

import pytest
import torch

from biencoder.engine.machine.rng import rng_states
from biencoder.engine.runs.checkpoint import restore_last
from biencoder.engine.runs.records import RunFolderError


class StubTrainer:
    """What :func:`restore_last` uses of an ``EpochTrainer``: its model, and ``load_state_dict`` for the optimiser,
    schedule and loader state (recorded here)."""

    def __init__(self):
        torch.manual_seed(0)
        self.model = torch.nn.Linear(3, 2)
        self.loaded = []

    def load_state_dict(self, state: dict) -> None:
        self.loaded.append(state)


def saved_state(processes: int) -> dict:
    """A ``last.pt`` state after epoch 2, written by ``processes`` processes: weights all 7, RNG states taken after
    seed 123 (not this process's)."""
    torch.manual_seed(123)
    rngs = [rng_states() for _ in range(processes)]
    weights = {k: torch.full_like(v, 7.0) for k, v in torch.nn.Linear(3, 2).state_dict().items()}
    best = {"epoch": 1, "metric": "top1", "value": 0.5, "metrics": None, "state": None, "hits": None}
    return {"epoch": 2, "model": weights, "rng": rngs, "best": best, "train_sim": None, "encoder_fingerprint": None}


def test_a_last_pt_of_another_process_count_is_refused_before_anything_is_restored(tmp_path):
    trainer = StubTrainer()
    weights = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    of_two, of_one = saved_state(2), saved_state(1)
    torch.manual_seed(5)
    rng = torch.get_rng_state()
    with pytest.raises(RunFolderError, match=r"saved by 2 process\(es\), not 1: resume with the same number"):
        restore_last(of_two, tmp_path / "last.pt", trainer, None)
    assert all(torch.equal(v, weights[k]) for k, v in trainer.model.state_dict().items())  # the weights untouched
    assert trainer.loaded == []  # nor the optimiser, schedule and loader state
    assert torch.equal(torch.get_rng_state(), rng)  # nor this process's RNG streams
    # the same state saved by one process is restored whole: the refusal above is not a stub that restores nothing
    epoch, best, _ = restore_last(of_one, tmp_path / "last.pt", trainer, None)
    assert (epoch, best.epoch, len(trainer.loaded)) == (3, 1, 1)
    assert all(bool((v == 7).all()) for v in trainer.model.state_dict().values())
    assert torch.equal(torch.get_rng_state(), of_one["rng"][0]["torch"])
