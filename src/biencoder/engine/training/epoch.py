"""One training epoch: mine this epoch's negatives, then one pass of optimisation steps over the triplets.

:class:`EpochTrainer` owns what changes from step to step (the loss, the optimiser, the LR schedule, the mining and
shuffling RNGs) and nothing about evaluation or the run folder; :class:`biencoder.engine.training.runner.Runner` drives
it. A step sums its loss parts (and, one step in ``trainer.stats_every``, the head statistics and gradient norms) on
the device (:class:`EpochSums`): the host reads them once per epoch, so no step waits for the device. What a step
consumes is :mod:`biencoder.engine.training.triplets`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from functools import partial

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler
from tqdm.auto import tqdm

from ..machine import distributed
from ..machine.runtime import Runtime
from ..modeling.encoding import to_device
from ..modeling.head import HEAD_STATISTIC_NAMES, head_statistics_vector
from ..modeling.model import BiModel
from ..retrieval.negatives import MinedNegatives, mine_negatives, random_rate
from .flat_params import FlatParameters, flat_state, per_parameter_state
from .settings import TrainingSettings, lr_factor
from .step_graph import GraphedStep, bucket_width, step_mode
from .triplets import TrainingInputs, TripletCollate, TripletStep, triplet_rows

log = logging.getLogger("biencoder")

#: the statistics a training step records, in the order of its vector: the head input's, then the gradient norms
STEP_STATISTICS = HEAD_STATISTIC_NAMES + ("grad_norm_encoder", "grad_norm_head")


class Diverged(RuntimeError):
    """A non-finite loss or embedding: the run stops at once (``final.json`` status ``diverged``)."""

    def __init__(self, epoch: int, what: str, parts: dict[str, float] | None = None):
        self.epoch, self.what, self.parts = epoch, what, dict(parts or {})
        detail = ", ".join(f"{k}={v:.4g}" for k, v in self.parts.items())
        super().__init__(
            f"training diverged in epoch {epoch}: non-finite {what}"
            + (f" ({detail})" if detail else "")
            + "; lower trainer.lr / trainer.head_lr or use trainer.precision=fp32"
        )


def _grad_norm(grads: list[torch.Tensor], device) -> torch.Tensor:
    """L2 norm (0-d tensor, on ``device``) over ``grads``: the norm of the per-tensor norms (one foreach call)."""
    return (
        torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads))) if grads else torch.zeros((), device=device)
    )


class EpochSums:
    """Per-step values summed on the device over an epoch and read by the host once (:meth:`means`): no step waits.

    The loss parts are summed in float64 on every step. The step statistics (:data:`STEP_STATISTICS`: the head
    statistics, about 20 passes over the step's [2B, F] head tensors, and the gradient norms, a foreach loop over
    the parameters on a CPU) are a sample: the first step of every ``every`` (``trainer.stats_every``), averaged over
    the sampled steps; ``every=1`` gives them all.
    """

    def __init__(self, every: int):
        self.every, self.steps, self.sampled = every, 0, 0
        self.part_names, self.parts, self.statistics = (), None, None

    def add(self, parts: dict[str, torch.Tensor], statistics: Callable[[], torch.Tensor]) -> None:
        """Add one step's loss ``parts`` (0-d tensors); on a sampled step, also ``statistics()``: the step's values
        of :data:`STEP_STATISTICS` [14] float32, computed only when called."""
        vector = torch.stack(list(parts.values()))
        if self.parts is None:
            self.part_names, self.parts = tuple(parts), vector.to(torch.float64)
        else:
            self.parts.add_(vector)
        if self.steps % self.every == 0:
            row = statistics()
            self.statistics = row.clone() if self.statistics is None else self.statistics.add_(row)
            self.sampled += 1
        self.steps += 1

    def means(self) -> dict[str, float]:
        """Mean per step of every loss part, and per sampled step of every step statistic (two host reads); empty
        before the first step. Named by the loss's parts and :data:`STEP_STATISTICS`."""
        if self.parts is None:
            return {}
        return {
            **{name: value / self.steps for name, value in zip(self.part_names, self.parts.tolist(), strict=True)},
            **{
                name: value / self.sampled
                for name, value in zip(STEP_STATISTICS, self.statistics.tolist(), strict=True)
            },
        }


class EpochTrainer:
    """Mining and optimisation over the training split, one epoch per :meth:`mine` + :meth:`train_epoch`.

    Args:
        settings: what it reads of the run's config (:class:`TrainingSettings`, made once at set-up).
        model: the :class:`BiModel`, already on the runtime's device.
        inputs: the training split and its cached pooled vectors (frozen encoder) or its token ids
            (:class:`TrainingInputs`).
        runtime: the device and the autocast dtype (None: fp32). ``progress``: show the step bar.
    """

    def __init__(
        self, settings: TrainingSettings, model: BiModel, inputs: TrainingInputs, runtime: Runtime, progress: bool
    ):
        self.settings, self.model, self.split = settings, model, inputs.split
        self.pooled, self.tokens = inputs.pooled, inputs.tokens
        self.device, self.amp_dtype, self.progress = runtime.device, runtime.autocast_dtype, progress
        self.mining = settings.mining
        self.frozen = self.pooled is not None
        groups = [(model.head_parameters(), settings.head_lr)]
        if not self.frozen:
            groups.insert(0, (list(model.encoder.parameters()), settings.lr))
        # each group's parameters as views of one flat tensor (engine/training/flat_params.py): the optimiser steps
        # 1-2 tensors a group (before DDP wraps the model, which keeps its own references to the parameters)
        self.flat = [FlatParameters(params, model.unused_parameters()) for params, _ in groups]
        self.step = self._step_module(TripletStep(model, settings.loss))
        # fused on every device: one kernel per step and group; on CUDA its step counters stay on the device, and a
        # CPU runs the kernel a GPU runs (foreach on a CPU is a loop of ~33 ops per tensor)
        self.optimizer = torch.optim.AdamW(
            [{"params": f.tensors(), "lr": lr} for f, (_, lr) in zip(self.flat, groups, strict=True)],
            weight_decay=settings.weight_decay,
            fused=True,
        )
        # the parameters whose gradient norms a step records (encoder, head); a frozen encoder has none
        self.grad_groups = ([] if self.frozen else list(model.encoder.parameters()), model.head_parameters())
        # mined (one per relevant pair), then given (triplet_rows)
        self.n_triplets = len(self.split.relevant_pairs[0]) + len(self.split.given_triplets)
        self.steps_per_epoch = math.ceil(math.ceil(self.n_triplets / distributed.world_size()) / settings.batch_size)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            lr_factor(settings.scheduler, settings.max_epochs * self.steps_per_epoch, settings.warmup_ratio),
        )
        self.rng = np.random.default_rng(settings.seed)  # mining's random negatives
        self.loader_generator = torch.Generator().manual_seed(settings.seed)  # the order of the triplets
        self.mode = step_mode(settings.cuda_graphs, self.device, distributed.world_size(), settings.compile)
        log.info("training step: %s", self.mode.why)
        self.graphed, self.width = None, None  # eager: each batch padded to its longest text
        if self.mode.graphs:
            self.graphed = GraphedStep(self.step, self.optimizer, self.device, self.amp_dtype)
            self.width = partial(bucket_width, max_length=settings.max_length)  # a few static token widths

    def _step_module(self, step: TripletStep) -> nn.Module:
        """The training forward as run: wrapped in DDP under several processes, compiled with ``trainer.compile``."""
        if distributed.world_size() > 1:
            step = nn.parallel.DistributedDataParallel(
                step,
                device_ids=[self.device.index] if self.device.type == "cuda" else None,
                # with cls/mean pooling the encoder's pooler computes an output no loss uses
                find_unused_parameters=not self.frozen and self.settings.pooling != "pooler",
                # rank 0's buffers to every rank before each forward: a BatchNorm head trains from and is evaluated
                # with rank 0's running statistics, its batch statistics each process's own (docs/heads.md)
                broadcast_buffers=True,
            )
        return torch.compile(step) if self.settings.compile else step

    # -- state (last.pt) --------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "optimizer": per_parameter_state(self.optimizer.state_dict(), self.flat),
            "scheduler": self.scheduler.state_dict(),
            "mining_rng": self.rng.bit_generator.state,
            "loader_rng": self.loader_generator.get_state(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(flat_state(state["optimizer"], self.flat))
        for group in self.optimizer.param_groups:  # a last.pt from before fused AdamW on a CPU saved foreach
            group.update(fused=True, foreach=None, capturable=False)
        self.scheduler.load_state_dict(state["scheduler"])
        self.rng.bit_generator.state = state["mining_rng"]
        self.loader_generator.set_state(state["loader_rng"])

    # -- one epoch --------------------------------------------------------------------------------------------
    def mine(self, epoch: int, train_sim: torch.Tensor | None) -> MinedNegatives:
        """This epoch's negatives, mined on rank 0 from ``train_sim`` [2Q, sim_dim] and shared with the other ranks."""
        rate = random_rate(epoch, *self.settings.random_rate)
        negatives = None
        if distributed.is_main():
            negatives = mine_negatives(train_sim.numpy(), self.split, rate, self.rng, self.mining)
        if distributed.world_size() > 1:
            n = self.split.n_pairs
            rows = distributed.broadcast_rows(None if negatives is None else negatives.row, n)
            if negatives is None:
                negatives = MinedNegatives(row=rows, is_random=np.zeros(n, bool), distance=np.zeros(n), rate=rate)
        return negatives

    def loader(self, epoch: int, negatives: MinedNegatives) -> DataLoader:
        """The trained encoder's batches: a DataLoader that pads the token batches (with workers if asked)."""
        settings = self.settings
        rows = list(triplet_rows(self.split, negatives))
        if distributed.world_size() > 1:
            sampler = DistributedSampler(
                rows,
                num_replicas=distributed.world_size(),
                rank=distributed.rank(),
                shuffle=True,
                seed=settings.seed,
            )
            sampler.set_epoch(epoch)
            shuffle, generator = None, None
        else:
            sampler, shuffle, generator = None, True, self.loader_generator
        return DataLoader(
            rows,
            batch_size=settings.batch_size,
            shuffle=shuffle,
            sampler=sampler,
            generator=generator,
            num_workers=settings.num_workers,
            collate_fn=TripletCollate(self.tokens, self.width),
            pin_memory=self.device.type == "cuda",
        )

    def batches(self, epoch: int, negatives: MinedNegatives):
        """This epoch's batches: yields (rows [B, 3] of (point, counter, negative), :class:`TripletStep` inputs,
        with the rows' text ids [3B]).

        Frozen encoder: each batch's cached pooled vectors [3B, hidden] are gathered on the device by one
        ``index_select``, in the order of a seeded permutation: no DataLoader, no copy of the split. Trained encoder:
        :meth:`loader`.
        """
        text_id = torch.tensor(self.split.training_text_id, device=self.device)
        if not self.frozen:
            for batch in self.loader(epoch, negatives):
                rows = batch.pop("rows")
                batch = to_device(batch, self.device)  # "padded" stays a host bool: BiModel.pool's mask, no sync
                yield rows.numpy(), {**batch, "text_id": text_id[rows.T.reshape(-1).to(self.device)]}
            return
        rows = triplet_rows(self.split, negatives)[self._order(epoch)]  # [Q, 3]
        index = torch.from_numpy(rows).to(self.device)
        size = self.settings.batch_size
        for start in range(0, len(rows), size):
            # points, then counters, then negatives, as TripletStep splits them
            batch = index[start : start + size].T.reshape(-1)
            yield (
                rows[start : start + size],
                {"pooled": self.pooled.index_select(0, batch), "text_id": text_id.index_select(0, batch)},
            )

    def _order(self, epoch: int) -> np.ndarray:
        """This rank's triplets for ``epoch`` in training order: a seeded permutation (its shard under DDP)."""
        if distributed.world_size() > 1:
            sampler = DistributedSampler(
                range(self.n_triplets),
                num_replicas=distributed.world_size(),
                rank=distributed.rank(),
                shuffle=True,
                seed=self.settings.seed,
            )
            sampler.set_epoch(epoch)
            return np.fromiter(iter(sampler), dtype=np.int64)
        return torch.randperm(self.n_triplets, generator=self.loader_generator).numpy()

    def train_epoch(self, epoch: int, negatives: MinedNegatives) -> dict[str, float]:
        """One pass over the training pairs with this epoch's negatives; returns mean loss parts and internals.

        The step sums everything on the device; the host reads the sums once, here. Raises :class:`Diverged` when
        the epoch's loss is not finite (a NaN or inf in any step makes the sum so).
        """
        sums = EpochSums(self.settings.stats_every)
        self.model.train()
        self.model.encoder.train(not self.frozen)
        bar = tqdm(
            self.batches(epoch, negatives),
            desc=f"epoch {epoch} train",
            disable=not self.progress,
            leave=False,
            total=self.steps_per_epoch,
        )
        for _, inputs in bar:
            self.train_step(inputs, sums)
            if self.progress and sums.steps % 20 == 0:  # a host read, only for a person watching the bar
                bar.set_postfix(loss=f"{sums.parts[0].item() / sums.steps:.3f}")
        means = distributed.mean_over_ranks(sums.means())
        parts = {key: means[key] for key in sums.part_names}
        if not all(map(math.isfinite, parts.values())):
            raise Diverged(epoch, "loss", parts)
        return means

    def train_step(self, inputs: dict[str, torch.Tensor], sums: EpochSums) -> None:
        """One optimisation step on one batch (:class:`TripletStep` inputs); its loss parts (and its head statistics
        and gradient norms, when ``sums`` samples this step) are added to ``sums`` on the device. Nothing here waits
        for the device. With CUDA graphs (:attr:`mode`) the forward, backward and optimiser step are one replay, and
        the statistics are read after it: the optimiser changes neither the gradients nor the head's features."""
        if self.graphed is not None:
            out = self.graphed(inputs)
        else:
            with torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.amp_dtype is not None):
                out = self.step(**inputs)
            self.optimizer.zero_grad(set_to_none=False)  # the flat gradient is zeroed in place: backward adds into it
            out.total.backward()
        sums.add(
            out.parts, lambda: torch.cat([head_statistics_vector(out.head_pre, out.head_post), self.grad_norms()])
        )
        if self.graphed is None:
            self.optimizer.step()
        self.scheduler.step()

    def grad_norms(self) -> torch.Tensor:
        """[2] float32 on the device: the L2 norms of this step's gradients of the encoder (0 when frozen) and the
        heads."""
        return torch.stack(
            [_grad_norm([p.grad for p in params if p.grad is not None], self.device) for params in self.grad_groups]
        ).float()
