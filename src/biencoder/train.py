"""Train one ablation cell: ``python -m biencoder.train +variant=ln_relu`` (sweep: ``-m '+variant=glob(*)' seed=0,1,2``).

Each epoch: mine negatives with the current weights (the training split's embeddings from the previous
epoch's evaluation are reused, so the split is embedded once per epoch), train on (point, counter, negative)
triplets, then evaluate retrieve-k-then-rerank top-1 on train, val and test. The run folder gets
``metrics.jsonl`` (one row per epoch and split, fsynced per epoch), ``train.log``, ``last.pt`` (the full
training state after every epoch, for ``trainer.resume``) and, at the end, ``best.pt``, ``test_hits.npy`` and
``final.json`` (atomically; ``status`` done, or failed / diverged with the error) with the 8 official tasks for
the best-by-val weights. With ``model.encoder.freeze=true`` the encoder's outputs come from the embedding cache.
Under ``torchrun`` rank 0 mines, evaluates and writes; every rank trains on its shard (DDP).
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path

import hydra
import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler
from tqdm.auto import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from . import distributed
from .cache import cached_pooled, encoder_fingerprint
from .checkpoint import checkpoint_payload
from .corpus import PairedSplit, run_splits, seen_queries
from .errors import BiencoderError
from .hydra_glue import conf_dir, fail, hydra_cli, register, variant_name
from .rerank import retrieve_rerank
from .loss import LossOutput, build_loss
from .model import (
    HEAD_STATISTIC_NAMES,
    BiModel,
    Embeddings,
    TokenizedTexts,
    build_model,
    embed_pooled,
    encode,
    encode_pooled,
    head_statistics_vector,
)
from .negatives import MinedNegatives, mine_negatives, random_rate
from .rundir import RunFolder, discard_if_ours
from .runtime import Runtime, decide, nondeterministic_op, set_seed_everywhere, show_progress
from .schema import validate
from .state import RunFolderError, rng_states, set_rng_states
from .tasks import evaluate_tasks, format_tasks
from .tracking import Tracker, check_packages

log = logging.getLogger("biencoder")
SPLITS = ("train", "val", "test")


class TripletCollate:
    """Rows [B, 3] of (point, counter, negative) → one padded encoder batch of 3B texts, plus the rows.

    Without ``tokens`` (frozen encoder: the pooled vectors are cached) the batch holds the rows only.
    """

    def __init__(self, tokens: TokenizedTexts | None):
        self.tokens = tokens

    def __call__(self, rows: list[np.ndarray]) -> dict[str, torch.Tensor]:
        rows = np.stack(rows)
        # all points, then all counters, then all negatives
        batch = self.tokens.batch(rows.T.ravel()) if self.tokens is not None else {}
        batch["rows"] = torch.from_numpy(rows)
        return batch


def triplet_rows(split: PairedSplit, negatives: MinedNegatives) -> np.ndarray:
    """[Q, 3] table rows (point, counter, negative) for this epoch: always built from the freshly mined ones."""
    return np.stack([split.query, split.counter, negatives.row], axis=1)


def _grad_norm(grads: list[torch.Tensor], device) -> torch.Tensor:
    """L2 norm (0-d tensor, on ``device``) over ``grads``: the norm of the per-tensor norms, one foreach call for those."""
    return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads))) if grads else torch.zeros((), device=device)


class EpochSums:
    """Per-step values summed on the device over an epoch and read by the host once (:meth:`means`): no step waits.

    The loss parts are summed in float64 and the statistics in float32, as when the parts were host floats and the
    statistics 0-d tensors, so the means are the same numbers to the last digit.
    """

    def __init__(self):
        self.steps, self.part_names, self.parts, self.stats = 0, (), None, None

    def add(self, parts: dict[str, torch.Tensor], stats: torch.Tensor) -> None:
        """Add one step's loss ``parts`` (0-d tensors) and ``stats`` [S] (names: :data:`STEP_STATISTICS`)."""
        vector = torch.stack(list(parts.values()))
        if self.parts is None:
            self.part_names, self.parts, self.stats = tuple(parts), vector.to(torch.float64), stats.float()
        else:
            self.parts.add_(vector)
            self.stats.add_(stats)
        self.steps += 1

    def means(self) -> dict[str, float]:
        """Mean per step of every part and statistic (two host reads); empty before the first step."""
        if self.parts is None:
            return {}
        values = dict(zip(self.part_names, self.parts.tolist()))
        values.update(zip(STEP_STATISTICS, self.stats.tolist()))
        return {key: value / self.steps for key, value in values.items()}


#: the statistics a training step records, in the order of its vector: the head input's, then the gradient norms
STEP_STATISTICS = HEAD_STATISTIC_NAMES + ("grad_norm_encoder", "grad_norm_head")


class Diverged(RuntimeError):
    """A non-finite loss or embedding: the run stops at once (``final.json`` status ``diverged``)."""

    def __init__(self, epoch: int, what: str, parts: dict[str, float] | None = None):
        self.epoch, self.what, self.parts = epoch, what, dict(parts or {})
        detail = ", ".join(f"{k}={v:.4g}" for k, v in self.parts.items())
        super().__init__(f"training diverged in epoch {epoch}: non-finite {what}" + (f" ({detail})" if detail else "")
                         + "; lower trainer.lr / trainer.head_lr or use trainer.precision=fp32")


class TripletStep(nn.Module):
    """The whole training forward (triplet batch → :class:`LossOutput`) as one module, so DDP wraps all of it.

    Takes token ids (encoder trained) or the cached pooled vectors [3B, hidden] (encoder frozen), ordered
    points, counters, negatives, and their text ids [3B] in the same order (``PairedSplit.text_id``: the loss
    masks duplicate texts with them).
    """

    def __init__(self, model: BiModel, loss_fn: nn.Module):
        super().__init__()
        self.model, self.loss_fn = model, loss_fn

    def forward(self, pooled: torch.Tensor | None = None, input_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, text_id: torch.Tensor | None = None) -> LossOutput:
        emb = self.model.from_pooled(pooled) if pooled is not None else self.model.embed(input_ids, attention_mask)
        point, counter, negative = emb.chunk(3)
        return self.loss_fn(self.model, point, counter, negative, None if text_id is None else text_id.view(3, -1))


def _lr_lambda(kind: str, total_steps: int, warmup_ratio: float):
    warmup = int(warmup_ratio * total_steps)

    def factor(step: int) -> float:
        if kind == "constant":
            return 1.0
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup))
    return factor


class Runner:
    """Holds one run's model, data and state; :meth:`fit` runs it end to end (resuming from ``last.pt``).

    ``runtime``: the start-up decision of device, precision and process group (:func:`start_up`, made here when
    None); the runner never asks torch again.
    """

    def __init__(self, cfg: DictConfig, out_dir: Path, experiment: str = "runs", runtime: Runtime | None = None):
        self.cfg, self.out_dir = cfg, Path(out_dir)
        self.folder = RunFolder(out_dir)
        corpus, self.splits = run_splits(cfg.data)
        self.runtime = start_up(cfg) if runtime is None else runtime  # decided once, at start-up
        self.device = self.runtime.device
        self.main = distributed.is_main()
        self.variant = variant_name(cfg)
        self.tracker = Tracker(cfg, self.out_dir, experiment, self.variant)  # opened on rank 0 when training starts
        set_seed_everywhere(cfg.seed)
        progress = show_progress(cfg)
        self.model, tokenizer = build_model(cfg.model, progress=progress)
        self.tokenizer = tokenizer  # saved into best.pt
        self.model.to(self.device)
        # test queries whose point or counter text occurs in a training or validation pair this run uses
        self.test_seen = seen_queries(self.splits["test"], [self.splits["train"], self.splits["val"]])
        self.overlap = {"dedup": bool(cfg.data.dedup), "dropped_pairs": dict(corpus.dropped),
                        "test_queries_seen": int(self.test_seen.sum()),
                        "test_queries_unseen": int((~self.test_seen).sum())}
        self.progress = progress and self.main
        self.amp_dtype = self.runtime.autocast_dtype
        self.frozen = bool(cfg.model.encoder.freeze)
        groups = [{"params": self.model.head_parameters(), "lr": cfg.trainer.head_lr}]
        self.fingerprint = None
        if self.frozen:
            # the encoder never changes: every text's pooled vector is computed once (or read from the cache)
            self.model.encoder.requires_grad_(False)
            self.fingerprint = encoder_fingerprint(self.model.encoder)
            if not self.main:
                distributed.barrier()  # rank 0 fills the cache first, the others read it
            # kept on the device: the training batches are gathered from them every epoch
            self.pooled = {name: cached_pooled(self.model, tokenizer, s.texts, cfg.model.max_length, cfg.trainer.cache_dir,
                                               self.fingerprint, cfg.trainer.eval_batch_size, self.device,
                                               self.amp_dtype, self.progress, desc=f"encode {name}").to(self.device)
                           for name, s in self.splits.items()}
            if self.main:
                distributed.barrier()
            self.tokens = {name: None for name in SPLITS}
        else:
            self.tokens = {name: TokenizedTexts(s.texts, tokenizer, cfg.model.max_length) for name, s in self.splits.items()}
            groups.insert(0, {"params": self.model.encoder.parameters(), "lr": cfg.trainer.lr})
        self.loss_fn = build_loss(cfg.loss)
        step = TripletStep(self.model, self.loss_fn)
        if distributed.world_size() > 1:
            step = nn.parallel.DistributedDataParallel(
                step, device_ids=[self.device.index] if self.device.type == "cuda" else None,
                # with cls/mean pooling the encoder's pooler computes an output no loss uses
                find_unused_parameters=not self.frozen and cfg.model.pooling != "pooler")
        self.step = torch.compile(step) if cfg.trainer.compile else step
        # CUDA: fused, one kernel per step and group, its step counters on the device (nothing read by the host).
        # Elsewhere foreach, one multi-tensor update instead of a Python loop over parameters: on a CPU the fused
        # kernel rounds differently (about 2e-7 apart per step), which would move same-seed CPU numbers
        fused = self.device.type == "cuda"
        self.optimizer = torch.optim.AdamW(groups, weight_decay=cfg.trainer.weight_decay, fused=fused, foreach=not fused)
        # the parameters whose gradient norms a step records (encoder, head); a frozen encoder has none
        self.grad_groups = ([] if self.frozen else list(self.model.encoder.parameters()), self.model.head_parameters())
        self.steps_per_epoch = math.ceil(math.ceil(self.splits["train"].n_pairs / distributed.world_size())
                                         / cfg.trainer.batch_size)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, _lr_lambda(
            cfg.trainer.scheduler, cfg.trainer.max_epochs * self.steps_per_epoch, cfg.trainer.warmup_ratio))
        self.rng = np.random.default_rng(cfg.seed)
        # the queries evaluated per epoch: all, or for train a fixed sample (the same for every seed and cell, so
        # train curves stay comparable); mining always uses every training pair
        n_train = self.splits["train"].n_pairs
        sample = cfg.eval.train_queries
        self.eval_pairs = {name: None for name in SPLITS}
        if sample is not None and sample < n_train:
            self.eval_pairs["train"] = np.sort(np.random.default_rng(0).choice(n_train, sample, replace=False))
        self.loader_generator = torch.Generator().manual_seed(cfg.seed)
        # the untrained encoder's pooled val/test vectors, for the zero-shot baseline in the summary
        self.zero_shot = None
        want = cfg.eval.baselines
        cheap = self.frozen or sum(len(self.splits[n].texts) for n in ("val", "test")) <= 2000
        if self.main and (want is True or (want == "auto" and cheap)):
            self.zero_shot = {n: self.pooled[n].cpu() if self.frozen else encode_pooled(
                self.model, self.tokens[n], cfg.trainer.eval_batch_size, self.device, self.amp_dtype,
                desc=f"encode {n} (zero-shot)") for n in ("val", "test")}

    # -- pieces -----------------------------------------------------------------------------------------------
    def embed(self, name: str) -> Embeddings:
        if self.frozen:
            return embed_pooled(self.model, self.pooled[name], self.cfg.eval.pair_batch_size, self.device)
        return encode(self.model, self.tokens[name], self.cfg.trainer.eval_batch_size, self.device,
                      self.amp_dtype, progress=self.progress, desc=f"encode {name}")

    def mine(self, epoch: int, train_sim: torch.Tensor | None) -> MinedNegatives:
        """This epoch's negatives, mined on rank 0 and shared with the other ranks."""
        rate = random_rate(epoch, self.cfg.negatives.random_rate.start, self.cfg.negatives.random_rate.decay)
        negatives = None
        if self.main:
            negatives = mine_negatives(train_sim.numpy(), self.splits["train"], rate, self.rng,
                                       self.cfg.negatives.n_neighbors, index=self.cfg.negatives.index, device=self.device)
        if distributed.world_size() > 1:
            n = self.splits["train"].n_pairs
            rows = distributed.broadcast_rows(None if negatives is None else negatives.row, n)
            if negatives is None:
                negatives = MinedNegatives(row=rows, is_random=np.zeros(n, bool), distance=np.zeros(n), rate=rate)
        return negatives

    def loader(self, epoch: int, negatives: MinedNegatives) -> DataLoader:
        cfg = self.cfg.trainer
        rows = list(triplet_rows(self.splits["train"], negatives))
        if distributed.world_size() > 1:
            sampler = DistributedSampler(rows, num_replicas=distributed.world_size(), rank=distributed.rank(),
                                         shuffle=True, seed=int(self.cfg.seed))
            sampler.set_epoch(epoch)
            shuffle, generator = None, None
        else:
            sampler, shuffle, generator = None, True, self.loader_generator
        return DataLoader(rows, batch_size=cfg.batch_size, shuffle=shuffle, sampler=sampler, generator=generator,
                          num_workers=cfg.num_workers, collate_fn=TripletCollate(self.tokens["train"]),
                          pin_memory=self.device.type == "cuda")

    def batches(self, epoch: int, negatives: MinedNegatives):
        """This epoch's batches: yields (rows [B, 3] of (point, counter, negative), :class:`TripletStep` inputs,
        with the rows' text ids [3B]).

        Frozen encoder: the cached pooled vectors of every triplet are gathered once per epoch into one
        [Q, 3, hidden] tensor on the device, in the order of a seeded permutation, and sliced: no DataLoader, no
        per-batch gathering. Trained encoder: a DataLoader pads the token batches (with workers if asked).
        """
        split = self.splits["train"]
        text_id = torch.tensor(split.text_id, device=self.device)
        if not self.frozen:
            for batch in self.loader(epoch, negatives):
                rows = batch.pop("rows")
                batch = {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
                yield rows.numpy(), {**batch, "text_id": text_id[rows.T.reshape(-1).to(self.device)]}
            return
        if distributed.world_size() > 1:
            sampler = DistributedSampler(range(split.n_pairs), num_replicas=distributed.world_size(),
                                         rank=distributed.rank(), shuffle=True, seed=int(self.cfg.seed))
            sampler.set_epoch(epoch)
            order = np.fromiter(iter(sampler), dtype=np.int64)
        else:
            order = torch.randperm(split.n_pairs, generator=self.loader_generator).numpy()
        rows = triplet_rows(split, negatives)[order]  # [Q, 3]
        index = torch.from_numpy(rows).to(self.device)
        gathered = self.pooled["train"][index]  # [Q, 3, hidden] on the device
        size = self.cfg.trainer.batch_size
        for start in range(0, len(rows), size):
            # points, then counters, then negatives, as TripletStep splits them
            yield rows[start:start + size], {"pooled": gathered[start:start + size].transpose(0, 1).reshape(
                -1, gathered.shape[-1]), "text_id": text_id[index[start:start + size].T.reshape(-1)]}

    def train_epoch(self, epoch: int, negatives: MinedNegatives) -> dict[str, float]:
        """One pass over the training pairs with this epoch's negatives; returns mean loss parts and internals.

        The step sums everything on the device; the host reads the sums once, here. Raises :class:`Diverged` when
        the epoch's loss is not finite (a NaN or inf in any step makes the sum so).
        """
        sums = EpochSums()
        self.model.train()
        self.model.encoder.train(not self.frozen)
        bar = tqdm(self.batches(epoch, negatives), desc=f"epoch {epoch} train", disable=not self.progress,
                   leave=False, total=self.steps_per_epoch)
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
        """One optimisation step on one batch (:class:`TripletStep` inputs); its loss parts, head statistics and
        gradient norms are added to ``sums`` on the device. Nothing here waits for the device."""
        with torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.amp_dtype is not None):
            out = self.step(**inputs)
        self.optimizer.zero_grad(set_to_none=True)
        out.total.backward()
        grad_norms = [_grad_norm([p.grad for p in params if p.grad is not None], self.device)
                      for params in self.grad_groups]
        sums.add(out.parts, torch.cat([head_statistics_vector(out.features, out.head_input), torch.stack(grad_norms)]))
        self.optimizer.step()
        self.scheduler.step()

    def evaluate_split(self, name: str, emb: Embeddings, epoch: int = -1) -> tuple[dict, np.ndarray]:
        """(metrics, per-query hits) of the per-epoch retrieve-and-rerank on split ``name`` with embeddings ``emb``."""
        if not (torch.isfinite(emb.sim).all() and torch.isfinite(emb.pooled).all()):
            raise Diverged(epoch, f"{name} embeddings")
        metrics, hits = retrieve_rerank(self.model, emb, self.splits[name], self.cfg.eval.k,
                                        self.cfg.eval.pair_batch_size, self.device, index=self.cfg.eval.index,
                                        pairs=self.eval_pairs[name], space=self.cfg.eval.retrieve)
        if name == "test":
            metrics.update(seen_unseen(hits, self.test_seen))
        return metrics, hits

    def evaluate_epoch(self, names, epoch: int = -1) -> tuple[dict[str, dict], dict[str, np.ndarray], dict[str, Embeddings]]:
        metrics, hits, embs = {}, {}, {}
        for name in names:
            embs[name] = self.embed(name)
            metrics[name], hits[name] = self.evaluate_split(name, embs[name], epoch)
        return metrics, hits, embs

    # -- checkpointing ----------------------------------------------------------------------------------------
    def _weights(self, state_dict: dict) -> dict:
        """What a checkpoint must hold of a state dict: all of it, or the heads only when the encoder is frozen
        (its weights are the pretrained ones, checked by fingerprint on resume)."""
        return {k: v for k, v in state_dict.items() if not (self.frozen and k.startswith("encoder."))}

    def save_last(self, epoch: int, best: dict, train_sim: torch.Tensor, rngs: list[dict]) -> None:
        """The full training state after ``epoch``, atomically: resuming from it continues bit for bit.

        ``rngs`` holds every rank's RNG states (index = rank), so each rank resumes its own dropout stream.
        """
        self.folder.save_state({
            "epoch": epoch,
            "model": self._weights(self.model.state_dict()),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng": rngs,
            "mining_rng": self.rng.bit_generator.state,
            "loader_rng": self.loader_generator.get_state(),
            "train_sim": train_sim,  # the embeddings the next epoch mines with
            "best": {**{k: v for k, v in best.items() if k not in ("state", "hits", "embs")},
                     "state": self._weights(best["state"]) if best["state"] else None,
                     "hits": None if best["hits"] is None else torch.from_numpy(best["hits"])},
            "encoder_fingerprint": self.fingerprint,
        })

    def load_last(self, state: dict) -> tuple[int, dict, torch.Tensor]:
        """Restore the state of ``last.pt``; returns (next epoch, best so far, train embeddings to mine with)."""
        if state["encoder_fingerprint"] != self.fingerprint:
            raise RunFolderError(f"{self.folder.last} was trained on another encoder than "
                                 "model.encoder.name_or_path loads now")
        self.model.load_state_dict(state["model"], strict=not self.frozen)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        rngs = state["rng"]
        if len(rngs) != distributed.world_size():
            raise RunFolderError(f"{self.folder.last} was saved by {len(rngs)} process(es), not "
                                 f"{distributed.world_size()}: resume with the same number of processes")
        set_rng_states(rngs[distributed.rank()])
        self.rng.bit_generator.state = state["mining_rng"]
        self.loader_generator.set_state(state["loader_rng"])
        best = dict(state["best"])
        if best["state"] is not None:
            full = {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}
            best["state"] = {**full, **best["state"]}
        best["hits"] = None if best["hits"] is None else best["hits"].numpy()
        return state["epoch"] + 1, best, state["train_sim"]

    # -- the run ----------------------------------------------------------------------------------------------
    def fit(self) -> dict | None:
        """Train (from ``last.pt`` when it exists) and return what ``final.json`` holds; None on ranks > 0."""
        with logging_redirect_tqdm():  # log lines go above the progress bars instead of through them
            return self._fit()

    def _start(self) -> tuple[int, dict, torch.Tensor | None]:
        state = self.folder.load_state()
        if state is not None:
            epoch, best, train_sim = self.load_last(state)
            dropped = self.folder.truncate(epoch - 1) if self.main else 0
            log.info("resuming %s after epoch %d (%d rows of epochs after the last checkpoint dropped)",
                     self.out_dir, epoch - 1, dropped)
            return epoch, best, train_sim
        if self.main:
            self.folder.truncate(-1)
        best = {"epoch": -1, "val_top1": -math.inf, "metrics": None, "state": None, "hits": None}
        if self.cfg.model.sim_init != "pca":
            return 0, best, self.embed("train").sim if self.main else None
        # every rank computes the same (float64, CPU) projection; the pooled vectors then give the first mining's
        # sim vectors too, so a trained encoder encodes the training split once here, not twice
        pooled = self.pooled["train"] if self.frozen else encode_pooled(
            self.model, self.tokens["train"], self.cfg.trainer.eval_batch_size, self.device, self.amp_dtype,
            progress=self.progress, desc="encode train")
        self.model.init_sim_from_pca(pooled)
        if not self.main:
            return 0, best, None
        return 0, best, embed_pooled(self.model, pooled, self.cfg.eval.pair_batch_size, self.device).sim

    def baselines(self) -> dict:
        """Top-1 of the zero-shot encoder's cosine and of TF-IDF on val and test: the same queries and pools as the
        per-epoch top-1 (the epa task), with the unseen/seen split on test."""
        out = {}
        for name in ("val", "test"):
            split = self.splits[name]
            groups = {"unseen": ~self.test_seen, "seen": self.test_seen} if name == "test" else None
            emb = Embeddings(torch.zeros(len(split.texts), 1), self.zero_shot[name])
            out[name] = {}
            for score in ("encoder_cosine", "tfidf"):
                epa = evaluate_tasks(split, score, emb=emb, groups=groups)["epa"]
                out[name][score] = {"top1": epa["accuracy_at_1"], "queries": epa["queries"],
                                    **{f"top1_{g}": v["accuracy_at_1"] for g, v in epa.get("groups", {}).items()}}
        return out

    def _fit(self) -> dict | None:
        cfg, start = self.cfg, time.time()
        base = {"variant": self.variant, "seed": int(cfg.seed)}
        rt, n = self.runtime, distributed.world_size()
        how = ([rt.device_name] if rt.device.type == "cuda" else []) + [rt.precision] + (
            ["deterministic"] if rt.deterministic else []) + [f"{n} process{'es' if n > 1 else ''}"]
        log.info("variant %s seed %d on %s (%s) | %s | pairs train/val/test %s", self.variant, cfg.seed, self.device,
                 ", ".join(how), cfg.data.name, "/".join(str(s.n_pairs) for s in self.splits.values()))
        if cfg.data.dedup:
            log.info("data.dedup: dropped %s pairs that share a text with a later split (test untouched); test "
                     "queries seen in train/val: %d, unseen: %d", self.overlap["dropped_pairs"],
                     self.overlap["test_queries_seen"], self.overlap["test_queries_unseen"])
        else:
            log.info("data.dedup=false: the official splits; %d of %d test queries share a text with a training "
                     "or validation pair (reported as seen/unseen)", self.overlap["test_queries_seen"],
                     len(self.test_seen))
        first_epoch, best, train_sim = self._start()
        if self.main:
            self.tracker.open(first_epoch)
        for epoch in tqdm(range(first_epoch, cfg.trainer.max_epochs), desc="epochs", disable=not self.progress,
                          initial=first_epoch, total=cfg.trainer.max_epochs):
            epoch_start = time.time()
            negatives = self.mine(epoch, train_sim)
            train_stats = self.train_epoch(epoch, negatives)
            if self.main:
                last = epoch == cfg.trainer.max_epochs - 1
                names = SPLITS if (epoch + 1) % cfg.eval.every == 0 or last else ("train",)
                metrics, hits, embs = self.evaluate_epoch(names, epoch)
                train_sim = embs["train"].sim  # the next epoch mines with these
                elapsed = time.time() - epoch_start
                rows = []
                for name in names:
                    row = {"epoch": epoch, "split": name, **base, **metrics[name]}
                    if name == "train":
                        row.update(train_stats, **negatives.stats(), epoch_time_s=elapsed)
                    rows.append(row)
                log.info("epoch %d  loss %.4f  " % (epoch, train_stats["loss"]) + "  ".join(
                    f"{n} top1 {metrics[n]['top1']:.3f}" for n in names) + f"  ({elapsed:.1f} s)")
                if "val" in metrics and metrics["val"]["top1"] > best["val_top1"]:
                    best = {"epoch": epoch, "val_top1": metrics["val"]["top1"], "metrics": metrics,
                            "state": {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()},
                            "hits": hits["test"],
                            # kept in memory for the 8 tasks at the end (recomputed there after a resume)
                            "embs": {n: embs[n] for n in ("val", "test")}}
                self.folder.append(rows)  # the epoch is on disk before the state that says it is done
                self.tracker.log_rows(rows)
            every = cfg.trainer.checkpoint_every
            if every and ((epoch + 1) % every == 0 or epoch == cfg.trainer.max_epochs - 1):
                rngs = distributed.all_gather_object(rng_states())  # every rank's own RNG streams
                if self.main:
                    self.save_last(epoch, best, train_sim, rngs)
            distributed.barrier()
        if not self.main:
            return None
        return self._finish(best, base, start)

    def _finish(self, best: dict, base: dict, start: float) -> dict:
        """8 tasks with the best-by-val weights; best.pt, test_hits.npy, then final.json (status done)."""
        cfg = self.cfg
        self.model.load_state_dict(best["state"])
        final = {"status": "done", **base, "data": cfg.data.name, "model": cfg.model.name,
                 "best_epoch": best["epoch"], "best": best["metrics"], "epochs": cfg.trainer.max_epochs,
                 "pairs": {n: s.n_pairs for n, s in self.splits.items()},
                 "overlap": self.overlap, "runtime": self.runtime.record()}
        if cfg.eval.tasks:
            final["tasks"] = {"score": cfg.eval.score}
            embs = best.get("embs", {})
            for name in ("val", "test"):
                emb = embs[name] if name in embs else self.embed(name)
                groups = {"unseen": ~self.test_seen, "seen": self.test_seen} if name == "test" else None
                final["tasks"][name] = evaluate_tasks(self.splits[name], cfg.eval.score, model=self.model,
                                                      emb=emb, k=cfg.eval.k, device=self.device,
                                                      batch_size=cfg.eval.pair_batch_size, groups=groups,
                                                      retrieve=cfg.eval.retrieve)
        if self.zero_shot is not None:
            final["baselines"] = self.baselines()
        checkpoint = None
        if cfg.trainer.save_checkpoint:
            checkpoint = checkpoint_payload(
                self.model, self.tokenizer, best["state"], best["epoch"], OmegaConf.to_container(cfg.model, resolve=True),
                run={"retrieve": cfg.eval.retrieve, "k": int(cfg.eval.k), "data": cfg.data.name,
                     "dedup": bool(cfg.data.dedup), "variant": self.variant, "seed": int(cfg.seed)})
        final["wall_time_s"] = round(time.time() - start, 2)
        self.folder.finish(final, {"test_hits": best["hits"], "test_seen": self.test_seen}, checkpoint,
                           keep_last=cfg.trainer.keep_last)
        self.tracker.finish(final)
        log.info("\n%s", summary_text(final, self.out_dir))
        return final


def seen_unseen(hits: np.ndarray, seen: np.ndarray) -> dict:
    """Top-1 on the unseen and the seen queries (None for an empty group) and their counts."""
    out = {}
    for group, mask in (("unseen", ~seen), ("seen", seen)):
        out[f"top1_{group}"] = float(hits[mask].mean()) if mask.any() else None
        out[f"queries_{group}"] = int(mask.sum())
    return out


def summary_text(final: dict, out_dir: Path) -> str:
    """The one-screen summary printed at the end of a run: metrics with a 95 % interval and the baselines on the
    same queries, what each metric means, the unseen/seen split, the 8 tasks."""
    from .report.statistics import wilson

    baselines = final.get("baselines", {})
    k = next(iter(final["best"].values()))["k"]
    lines = [f"== {final['variant']} seed {final['seed']} | {final['model']} on {final['data']} | "
             f"best epoch {final['best_epoch']} (of 0-{final['epochs'] - 1}, by val top1) | {final['wall_time_s']:.0f} s",
             f"{'split':<6} {'queries':>7} {'top1':>6} {'95% CI':>15} {'retr@1':>7} {'R@k':>6} {'MRR':>6}"
             + ("  | zero-shot   TF-IDF" if baselines else "")]
    for name, m in final["best"].items():
        low, high = wilson(round(m["top1"] * m["queries"]), m["queries"])
        row = (f"{name:<6} {m['queries']:>7} {m['top1']:>6.3f} {f'[{low:.3f}, {high:.3f}]':>15} "
               f"{m['retrieval_top1']:>7.3f} {m['recall_at_k']:>6.3f} {m['mrr']:>6.3f}")
        if name in baselines:
            b = baselines[name]
            row += f"  | {b['encoder_cosine']['top1']:>9.3f} {b['tfidf']['top1']:>8.3f}"
        lines.append(row)
    lines.append(f"top1: the true counter ranks first after the classifier reranks the k={k} nearest (pool: every "
                 "argument of the split, as in the epa task); retr@1: the nearest is the true counter; R@k: it is "
                 "among the k; MRR: mean 1/rank after reranking (0 outside the k); 95% CI: Wilson interval over "
                 "this run's queries (nothing about other seeds)"
                 + ("; zero-shot / TF-IDF: the untrained encoder's cosine and TF-IDF top-1 on the same queries "
                    "and pools" if baselines else "")
                 + (". The train row uses a fixed sample of the training queries (eval.train_queries)."
                    if final["best"]["train"]["queries"] < final.get("pairs", {}).get("train", 0) else "."))
    test, overlap = final["best"]["test"], final.get("overlap", {})
    if "queries_unseen" in test:
        shown = lambda v: "–" if v is None else f"{v:.3f}"
        lines.append(f"test top1 on queries unseen in train/val: {shown(test['top1_unseen'])} "
                     f"(n={test['queries_unseen']}); seen: {shown(test['top1_seen'])} (n={test['queries_seen']}); "
                     + ("data.dedup dropped " + ", ".join(f"{k} {v}" for k, v in overlap.get("dropped_pairs", {}).items())
                        + " pairs" if overlap.get("dedup") else "official splits (data.dedup=false)"))
    if "tasks" in final:
        lines.append(f"8 tasks, score={final['tasks']['score']}, best-by-val weights:")
        lines.append(format_tasks({n: final["tasks"][n] for n in ("val", "test")}))
    lines.append(f"run folder: {out_dir}")
    return "\n".join(lines)


def start_up(cfg: DictConfig) -> Runtime:
    """Start-up: decide device, precision and process group once (:func:`biencoder.runtime.decide`), set torch's
    determinism switches (before any CUDA work) and start the process group (only under torchrun with several
    processes). Raises :class:`ConfigError` when the decision cannot work."""
    runtime = decide(cfg.trainer.device, cfg.trainer.precision, cfg.trainer.deterministic)
    runtime.apply()
    distributed.setup(runtime)
    return runtime


def run(cfg: DictConfig, out_dir: Path, experiment: str = "runs", runtime: Runtime | None = None) -> dict | None:
    """Train one cell into ``out_dir`` (or continue it, with ``trainer.resume``); returns what ``final.json`` holds.

    A finished folder (status ``done``) is left as it is when resuming, so a re-run sweep skips its done jobs.
    On a crash ``final.json`` says ``failed`` (or ``diverged``) with the error, the trackers close the run as
    FAILED, and the exception propagates. ``experiment``: the MLflow experiment (one per sweep). ``runtime``: the
    start-up decision (:func:`start_up`; made here when None).
    """
    validate(cfg)  # once per run, before the folder is touched (the runner trusts it)
    check_packages(cfg)
    runtime = start_up(cfg) if runtime is None else runtime
    folder = RunFolder(out_dir)
    if not distributed.is_main():
        log.setLevel(logging.WARNING)  # rank 0 speaks for the run
    done = folder.open(cfg, main=distributed.is_main(), runtime=runtime)
    if done is not None:
        return done
    runner = Runner(cfg, folder.path, experiment, runtime)  # reads the corpus first
    if runner.main:
        folder.start(cfg, runtime)
    try:
        return runner.fit()
    except Diverged as err:
        if runner.main:
            folder.record("diverged", variant=runner.variant, seed=int(cfg.seed), epoch=err.epoch, what=err.what,
                          loss_parts=err.parts, error=str(err))
            runner.tracker.finish({}, "diverged")
        raise
    except BaseException as err:
        if runner.main:
            folder.record("failed", variant=runner.variant, seed=int(cfg.seed), error=f"{type(err).__name__}: {err}")
            runner.tracker.finish({}, "failed")
        raise


register()


@hydra.main(version_base="1.3", config_path=conf_dir(), config_name="config")
def main(cfg: DictConfig) -> float | None:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hydra_cfg = HydraConfig.get()
    out_dir = Path(hydra_cfg.runtime.output_dir)
    try:
        final = runtime = None
        runtime = start_up(cfg)  # the one decision; the process group only under torchrun with several processes
        shared = Path(distributed.broadcast_object(str(out_dir)))  # every rank works in rank 0's folder
        if shared != out_dir:
            discard_if_ours(out_dir)  # this rank's own (empty) Hydra folder
            out_dir = shared
        experiment = Path(hydra_cfg.sweep.dir).name if hydra_cfg.mode == RunMode.MULTIRUN else "runs"
        final = run(cfg, out_dir, experiment, runtime)
    except BiencoderError as err:
        fail(err, out_dir)
    except Diverged as err:
        if hydra_cfg.mode == RunMode.MULTIRUN:  # one diverged cell must not end the sweep; final.json says it
            log.error("%s: %s", out_dir, err)
            return None
        fail(err, None, code=3)
    except RuntimeError as err:  # after Diverged (one too): an operation without a deterministic kernel
        unsupported = nondeterministic_op(err, runtime.device.type if runtime else "this device")
        if unsupported is None:
            raise
        fail(unsupported, out_dir)
    finally:
        distributed.teardown()
    return None if final is None else final["best"]["val"]["top1"]


def cli() -> None:
    """The ``biencoder-train`` command (Hydra tab completion: ``eval "$(biencoder-train -sc install=bash)"``)."""
    hydra_cli(main)


if __name__ == "__main__":
    cli()
