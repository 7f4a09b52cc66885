"""What the training epochs read of a run's config, read once at set-up: :class:`TrainingSettings`
(:meth:`TrainingSettings.of_run`), and the learning-rate schedule it names (:func:`lr_factor`).

:class:`~biencoder.engine.training.epoch.EpochTrainer` takes these objects and never the config, as
:class:`~biencoder.engine.retrieval.negatives.Mining`, :class:`~biencoder.engine.retrieval.rerank.Rerank` and
:class:`~biencoder.engine.modeling.encoding.Encoding` are made once by their ``of_run`` for the parts they run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from ..machine.runtime import Runtime
from ..modeling.loss import build_loss
from ..retrieval.negatives import Mining


@dataclass(frozen=True)
class TrainingSettings:
    """A run's training settings (the config keys in brackets).

    Attributes:
        seed: the mining's random negatives and the order of the triplets start from it (``seed``).
        batch_size: triplets per step (``trainer.batch_size``); ``max_epochs`` (``trainer.max_epochs``).
        lr, head_lr: the encoder's and the heads' learning rates (``trainer.lr``, ``trainer.head_lr``);
            ``weight_decay`` (``trainer.weight_decay``).
        scheduler, warmup_ratio: the schedule (``trainer.scheduler``, ``trainer.warmup_ratio``: :func:`lr_factor`).
        stats_every: the step statistics of one step in N (``trainer.stats_every``).
        num_workers: DataLoader workers (``trainer.num_workers``).
        compile, cuda_graphs: how the step runs (``trainer.compile``, ``trainer.cuda_graphs``).
        max_length: the tokens of a text (``model.max_length``: the widest bucket of a graphed step).
        pooling: ``model.pooling`` (the pooler is unused but under ``pooler``: DDP's unused-parameter search).
        random_rate: (start, decay) of the share of random negatives (``negatives.random_rate.*``).
        loss: the loss module ``loss`` names (:func:`~biencoder.engine.modeling.loss.build_loss`).
        mining: how negatives are searched for (``negatives.*``, on the runtime's device).
    """

    seed: int
    batch_size: int
    max_epochs: int
    lr: float
    head_lr: float
    weight_decay: float
    scheduler: str
    warmup_ratio: float
    stats_every: int
    num_workers: int
    compile: bool
    cuda_graphs: bool | str
    max_length: int
    pooling: str
    random_rate: tuple[float, float]
    loss: nn.Module
    mining: Mining

    @classmethod
    def of_run(cls, cfg, runtime: Runtime) -> TrainingSettings:
        """The settings of the run ``cfg`` (a validated config) on ``runtime``."""
        trainer, rate = cfg.trainer, cfg.negatives.random_rate
        return cls(
            seed=int(cfg.seed),
            batch_size=int(trainer.batch_size),
            max_epochs=int(trainer.max_epochs),
            lr=float(trainer.lr),
            head_lr=float(trainer.head_lr),
            weight_decay=float(trainer.weight_decay),
            scheduler=str(trainer.scheduler),
            warmup_ratio=float(trainer.warmup_ratio),
            stats_every=int(trainer.stats_every),
            num_workers=int(trainer.num_workers),
            compile=bool(trainer.compile),
            cuda_graphs=trainer.cuda_graphs,
            max_length=int(cfg.model.max_length),
            pooling=str(cfg.model.pooling),
            random_rate=(float(rate.start), float(rate.decay)),
            loss=build_loss(cfg.loss),
            mining=Mining.of_run(cfg.negatives, runtime),
        )


def lr_factor(kind: str, total_steps: int, warmup_ratio: float) -> Callable[[int], float]:
    """The learning rate's factor at each step (for ``LambdaLR``): 1 for ``constant``; for ``linear``, a linear
    rise over the first ``warmup_ratio`` of the ``total_steps`` (from 1/warmup to 1), then a linear fall to 0."""
    warmup = int(warmup_ratio * total_steps)

    def factor(step: int) -> float:
        if kind == "constant":
            return 1.0
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup))

    return factor
