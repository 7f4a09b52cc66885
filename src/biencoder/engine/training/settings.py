"""What a run reads of its config, read once at set-up: :class:`TrainingSettings` (the training epochs'),
:class:`RunSettings` (the runner's: the epoch loop, its records and its end) and :class:`EvalSettings` (what a run is
scored by), each made by its ``of_run``; and the learning-rate schedule (:func:`lr_factor`).

:class:`~biencoder.engine.training.epoch.EpochTrainer`, :class:`~biencoder.engine.training.runner.Runner` and
:class:`~biencoder.engine.training.evaluation.Evaluation` take these objects and never read the config after set-up, as
:class:`~biencoder.engine.retrieval.negatives.Mining`, :class:`~biencoder.engine.retrieval.rerank.Rerank` and
:class:`~biencoder.engine.modeling.encoding.Encoding` are made once by their ``of_run`` for the parts they run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from omegaconf import OmegaConf
from torch import nn

from ..config.selection import selection
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


@dataclass(frozen=True)
class EvalSettings:
    """What a run is scored by (the config keys in brackets).

    Attributes:
        selection: what picks the best epoch and what the hits are of (:func:`~biencoder.engine.config.selection.
            selection` of ``loss.ce_weight``, ``eval.select``, ``data.layout``; ``final.json``'s ``selection``).
        queries: split → the size of the fixed sample of its queries scored per epoch, None for all
            (``eval.<split>_queries``).
        score: what the 8 tasks score pairs by (``eval.score``); ``tasks``: whether they run (``eval.tasks``).
        baselines: zero-shot and TF-IDF in the summary: True, False or ``auto`` (``eval.baselines``).
    """

    selection: dict
    queries: dict[str, int | None]
    score: str
    tasks: bool
    baselines: bool | str

    @classmethod
    def of_run(cls, cfg) -> EvalSettings:
        """The scoring settings of the run ``cfg`` (a validated config)."""
        ev = cfg.eval
        return cls(
            selection=selection(cfg.loss.ce_weight, ev.select, cfg.data.layout),
            queries={name: ev.get(f"{name}_queries") for name in ("train", "val", "test")},
            score=str(ev.score),
            tasks=bool(ev.tasks),
            baselines=ev.baselines,
        )


@dataclass(frozen=True)
class RunSettings:
    """What the runner's epoch loop and its end read (the config keys in brackets).

    Attributes:
        seed: ``seed``; ``max_epochs``: ``trainer.max_epochs``.
        eval_every: val and test every N epochs and after the last (``eval.every``).
        checkpoint_every: ``last.pt`` every N epochs and after the last, 0 never (``trainer.checkpoint_every``).
        log_negatives: each epoch's mined negatives in the run folder (``negatives.log``).
        pca_init: the sim head starts from the training split's PCA (``model.sim_init`` = ``pca``).
        save_checkpoint, keep_last: ``best.pt`` written, ``last.pt`` kept at the end (``trainer.*``).
        record: ``final.json``'s names of the run's data and model: ``data`` (``data.name``), ``model``
            (``model.name``); its pool is :class:`~.inputs.RunData`'s.
        retrieval: ``best.pt``'s retrieval settings (``eval.retrieve``, ``eval.k``, ``data.name``, ``data.dedup``).
        model: ``best.pt``'s model config (``model``, resolved).
    """

    seed: int
    max_epochs: int
    eval_every: int
    checkpoint_every: int
    log_negatives: bool
    pca_init: bool
    save_checkpoint: bool
    keep_last: bool
    record: dict
    retrieval: dict
    model: dict

    @classmethod
    def of_run(cls, cfg) -> RunSettings:
        """The runner's settings of the run ``cfg`` (a validated config)."""
        trainer = cfg.trainer
        return cls(
            seed=int(cfg.seed),
            max_epochs=int(trainer.max_epochs),
            eval_every=int(cfg.eval.every),
            checkpoint_every=int(trainer.checkpoint_every),
            log_negatives=bool(cfg.negatives.log),
            pca_init=cfg.model.sim_init == "pca",
            save_checkpoint=bool(trainer.save_checkpoint),
            keep_last=bool(trainer.keep_last),
            record={"data": cfg.data.name, "model": cfg.model.name},
            retrieval={
                "retrieve": cfg.eval.retrieve,
                "k": int(cfg.eval.k),
                "data": cfg.data.name,
                "dedup": bool(cfg.data.dedup),
            },
            model=OmegaConf.to_container(cfg.model, resolve=True),
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
