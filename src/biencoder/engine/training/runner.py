"""One training run, end to end: data, model, the epoch loop, evaluation, the best epoch, the run folder.

Each epoch: mine negatives with the current weights (the training split's embeddings from the previous
epoch's evaluation are reused, so the split is embedded once per epoch), train on (point, counter, negative)
triplets (:mod:`biencoder.engine.training.epoch`), then evaluate retrieve-k-then-rerank top-1 on train, val and test
(:mod:`biencoder.engine.retrieval.rerank`). The run folder gets ``metrics.jsonl`` (one row per epoch and split, fsynced per epoch),
``train.log``, ``last.pt`` (the full training state, for ``trainer.resume``: :mod:`biencoder.engine.runs.checkpoint`) and, at
the end, ``best.pt``, ``test_hits.npy`` and ``final.json`` (atomically; ``status`` done, or failed / diverged with the
error) with the 8 official tasks for the best-by-val weights. The best epoch is the first with the highest val value of
the metric :func:`biencoder.engine.config.schema.selection` names (``final.json``'s ``selection``): the reranked top-1, or
the retrieval top-1 when the pair classifier is not trained (``loss.ce_weight=0``). With ``model.encoder.freeze=true``
the encoder's outputs come from the embedding cache. Under ``torchrun`` rank 0 mines, evaluates and writes; every rank
trains on its shard (DDP). No Hydra here: :func:`run` takes a plain ``DictConfig``; the ``biencoder.train`` app is its
Hydra shell.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any, Callable, TypeVar

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from ..config.schema import selection, untrained_classifier_note, variant_name
from ..config.validation import validate
from ..data.corpus import run_splits, seen_queries
from ..data.paired import POOL_TEXT
from ..machine import distributed
from ..machine.rng import rng_states
from ..machine.runtime import Runtime, decide, set_seed_everywhere, show_progress
from ..modeling.cache import encoder_fingerprint
from ..modeling.model import (
    Embeddings,
    TokenizedTexts,
    build_model,
    embed_pooled,
    encode,
    encode_pooled,
    eval_mode,
    is_encoder_weight,
    pooled_vectors,
)
from ..retrieval.groups import group_rerank
from ..retrieval.official_tasks import baseline_ranks, evaluate_tasks
from ..retrieval.rerank import NonFiniteMargins, query_groups, query_sample, retrieve, retrieve_rerank, seen_unseen
from ..runs.checkpoint import checkpoint_payload, restore_last, training_state
from ..runs.folder import RunFolder, claim, release
from ..runs.tracking import Tracker, check_packages
from .epoch import Diverged, EpochTrainer

log = logging.getLogger("biencoder")
SPLITS = ("train", "val", "test")
#: final.json's ``tasks_skipped`` and the summary's line when the data cannot have the 8 official tasks
NO_TASKS = (
    "no 8-task table: the official tasks type candidates by ArguAna's debates, sides and themes, which pair "
    "files do not have; the per-epoch top-1 (and top1_group where the files have groups) is this data's result"
)
T = TypeVar("T")


def untimed(name: str, fn: Callable[[], T]) -> T:
    """The default :attr:`Runner.phase`: runs ``fn`` (``scripts/bench.py`` puts a timer in its place)."""
    return fn()


class Runner:
    """Holds one run's model, data and state; :meth:`fit` runs it end to end (resuming from ``last.pt``).

    ``runtime``: the start-up decision of device, precision and process group (:func:`start_up`, made here when
    None); the runner never asks torch again. ``variant``: the cell's name (the app passes Hydra's ``+variant=``
    choice; default: named after the head flags, :func:`schema.variant_name`). The config is trusted: :func:`run`
    validates it once.
    """

    def __init__(
        self,
        cfg: DictConfig,
        out_dir: Path,
        experiment: str = "runs",
        runtime: Runtime | None = None,
        variant: str | None = None,
    ):
        self.cfg, self.out_dir = cfg, Path(out_dir)
        self.folder = RunFolder(out_dir)
        corpus, self.splits = run_splits(cfg.data)
        self.runtime = start_up(cfg) if runtime is None else runtime  # decided once, at start-up
        self.device, self.amp_dtype = self.runtime.device, self.runtime.autocast_dtype
        self.pair_batch_size = self.runtime.pair_batch_size(cfg.eval.pair_batch_size)
        self.main = distributed.is_main()
        self.variant = variant_name(cfg, variant)
        self.selection = selection(cfg.loss.ce_weight)  # what picks the best epoch (final.json's "selection")
        self.tracker = Tracker(cfg, self.out_dir, experiment, self.variant)  # opened on rank 0 when training starts
        shown = show_progress(cfg)
        set_seed_everywhere(cfg.seed)
        self.model, self.tokenizer = build_model(cfg.model, progress=shown)  # the tokenizer: saved into best.pt
        self.model.to(self.device)
        # test queries whose point or counter text occurs in a training or validation pair this run uses
        self.test_seen = seen_queries(self.splits["test"], [self.splits["train"], self.splits["val"]])
        self.overlap = {
            "dedup": bool(cfg.data.dedup),
            "dropped_pairs": dict(corpus.dropped),
            "test_queries_seen": int(self.test_seen.sum()),
            "test_queries_unseen": int((~self.test_seen).sum()),
        }
        # pair files: where the data came from (path, size, sha256 per file) and the rows that repeat a pair
        self.data_files, self.counts = getattr(corpus, "files", {}), corpus.counts
        self.progress = shown and self.main
        self.frozen = bool(cfg.model.encoder.freeze)
        self.fingerprint, self.pooled, self.tokens = self._inputs()
        self.trainer = EpochTrainer(
            cfg, self.model, self.splits["train"], *self._training_inputs(), self.device, self.amp_dtype, self.progress
        )
        self.eval_pairs = self._eval_pairs()
        self.shortlists: dict[str, np.ndarray] = {}  # fixed_shortlists, per split
        self.encoder_weights: dict[str, torch.Tensor] | None = None  # a frozen encoder's, taken once (_weights_on_cpu)
        self.zero_shot = self._zero_shot()
        # (name, fn) -> fn(), around each phase of an epoch: the bench times the runner's own epoch through it
        self.phase: Callable[[str, Callable[[], Any]], Any] = untimed

    def _inputs(self) -> tuple[str | None, dict[str, torch.Tensor], dict[str, TokenizedTexts]]:
        """(encoder fingerprint, pooled vectors per split, token ids per split): a frozen encoder's pooled vectors
        are computed once (or read from the cache) and kept on the device, where the training batches are gathered
        from them every epoch; a trained encoder's texts are tokenised once."""
        cfg = self.cfg
        if not self.frozen:
            return (
                None,
                {},
                {
                    name: TokenizedTexts(s.texts, self.tokenizer, cfg.model.max_length)
                    for name, s in self.splits.items()
                },
            )
        self.model.encoder.requires_grad_(False)
        fingerprint = encoder_fingerprint(self.model.encoder)
        if not self.main:
            distributed.barrier()  # rank 0 fills the cache first, the others read it
        # the training split's given negatives (pair files) are encoded with it: rows 2Q + j of the trainer's vectors
        pooled = {
            name: pooled_vectors(
                self.model,
                self.tokenizer,
                s.texts + (s.extra_texts if name == "train" else []),
                cfg.model.max_length,
                cfg.trainer.cache_dir,
                cfg.trainer.eval_batch_size,
                self.device,
                self.amp_dtype,
                self.progress,
                f"encode {name}",
                fingerprint,
            ).to(self.device)
            for name, s in self.splits.items()
        }
        if self.main:
            distributed.barrier()
        return fingerprint, pooled, {}

    def _training_inputs(self) -> tuple[torch.Tensor | None, TokenizedTexts | None]:
        """(pooled vectors, token ids) the trainer gathers its triplets from: the training split's rows, then its given
        negatives (:attr:`PairedSplit.extra_texts`); :attr:`pooled` and :attr:`tokens` keep the split's rows only."""
        train = self.splits["train"]
        if self.frozen:
            pooled, self.pooled["train"] = self.pooled["train"], self.pooled["train"][: len(train.texts)]
            return pooled, None
        if not train.extra_texts:
            return None, self.tokens["train"]
        return None, TokenizedTexts(train.texts + train.extra_texts, self.tokenizer, self.cfg.model.max_length)

    def _eval_pairs(self) -> dict[str, np.ndarray | None]:
        """The queries evaluated per epoch, per split: all (None), or a fixed sample of ``eval.<split>_queries``
        (:func:`rerank.query_sample`: the same for every seed and cell, so curves stay comparable). Mining always uses
        every training pair, the pools stay whole splits, and the 8 tasks at the end score every query."""
        return {name: query_sample(self.splits[name].n_pairs, self.cfg.eval.get(f"{name}_queries")) for name in SPLITS}

    @property
    def eval_seen(self) -> np.ndarray:
        """[P] bool: :attr:`test_seen` of the test queries evaluated per epoch (all, or ``eval.test_queries``): what the
        per-epoch test numbers, ``test_hits.npy`` and the baselines are split into unseen and seen by."""
        pairs = self.eval_pairs["test"]
        return self.test_seen if pairs is None else self.test_seen[pairs]

    def _zero_shot(self) -> dict[str, torch.Tensor] | None:
        """The untrained encoder's pooled val/test vectors, for the zero-shot baseline in the summary (rank 0, when
        ``eval.baselines`` asks for it: ``auto`` = when cheap)."""
        want = self.cfg.eval.baselines
        cheap = self.frozen or sum(len(self.splits[n].texts) for n in ("val", "test")) <= 2000
        if not self.main or not (want is True or (want == "auto" and cheap)):
            return None
        return {
            n: self.pooled[n].cpu()
            if self.frozen
            else encode_pooled(
                self.model,
                self.tokens[n],
                self.cfg.trainer.eval_batch_size,
                self.device,
                self.amp_dtype,
                desc=f"encode {n} (zero-shot)",
            )
            for n in ("val", "test")
        }

    # -- evaluation -------------------------------------------------------------------------------------------
    def embed(self, name: str) -> Embeddings:
        if self.frozen:
            return embed_pooled(self.model, self.pooled[name], self.pair_batch_size, self.device)
        return encode(
            self.model,
            self.tokens[name],
            self.cfg.trainer.eval_batch_size,
            self.device,
            self.amp_dtype,
            progress=self.progress,
            desc=f"encode {name}",
        )

    def evaluate_split(self, name: str, emb: Embeddings, epoch: int = -1) -> tuple[dict, np.ndarray]:
        """(metrics, per-query hits) of the per-epoch retrieve-and-rerank on split ``name`` with embeddings ``emb``;
        the hits [Q] bool are those of the selection metric (:attr:`selection`): reranked, or the nearest neighbour."""
        # a frozen encoder's pooled vectors were checked finite once, when pooled_vectors returned them
        if not (torch.isfinite(emb.sim).all() and (self.frozen or torch.isfinite(emb.pooled).all())):
            raise Diverged(epoch, f"{name} embeddings")
        split, pairs, cfg = self.splits[name], self.eval_pairs[name], self.cfg.eval
        rows = self.fixed_shortlists(name, emb)
        if rows is None:  # searched here rather than inside retrieve_rerank: the nearest neighbours are a hit too
            rows, _ = retrieve(emb.retrieval(cfg.retrieve).numpy(), split, cfg.k, cfg.index, self.device, pairs)
        seen = self.eval_seen if name == "test" else None
        try:
            metrics, hits = retrieve_rerank(
                self.model,
                emb,
                split,
                cfg.k,
                self.pair_batch_size,
                self.device,
                index=cfg.index,
                pairs=pairs,
                space=cfg.retrieve,
                rows=rows,
            )
            if split.groups is not None:  # pair files with a group column: the within-group top-1 too
                metrics.update(
                    group_rerank(
                        self.model,
                        emb,
                        split,
                        cfg.k,
                        self.pair_batch_size,
                        self.device,
                        cfg.index,
                        pairs,
                        cfg.retrieve,
                        seen,
                    )[0]
                )
        except NonFiniteMargins as err:  # never ranked: a NaN would count as a hit
            raise Diverged(epoch, f"{name} classifier margins ({err.count} of {err.total})") from err
        if seen is not None:
            metrics.update(seen_unseen(hits, seen))
        if self.selection["metric"] == "retrieval_top1":
            hits = rows[:, 0] == split.counter[np.arange(split.n_pairs) if pairs is None else pairs]
        return metrics, hits

    def fixed_shortlists(self, name: str, emb: Embeddings) -> np.ndarray | None:
        """The per-epoch shortlists of split ``name`` when they cannot change: a frozen encoder's own space
        (``eval.retrieve=encoder``) is the same every epoch, so it is searched once per run; else None."""
        if not (self.frozen and self.cfg.eval.retrieve == "encoder"):
            return None
        if name not in self.shortlists:
            self.shortlists[name], _ = retrieve(
                emb.retrieval("encoder").numpy(),
                self.splits[name],
                self.cfg.eval.k,
                self.cfg.eval.index,
                self.device,
                self.eval_pairs[name],
            )
        return self.shortlists[name]

    def evaluate_epoch(
        self, names, epoch: int = -1
    ) -> tuple[dict[str, dict], dict[str, np.ndarray], dict[str, Embeddings]]:
        metrics, hits, embs = {}, {}, {}
        with eval_mode(self.model):  # once for every split, not twice per split
            for name in names:
                embs[name] = self.phase(f"encode {name}", lambda: self.embed(name))
                metrics[name], hits[name] = self.phase(
                    f"retrieve+rerank {name}", lambda: self.evaluate_split(name, embs[name], epoch)
                )
        return metrics, hits, embs

    def baselines(self) -> dict:
        """Top-1 of the zero-shot encoder's cosine and of TF-IDF on val and test (:func:`tasks.baseline_ranks`): the
        same queries (``eval.val_queries`` / ``eval.test_queries``) and pools as the per-epoch top-1 (the epa task),
        with the unseen/seen split on test."""
        out = {}
        for name in ("val", "test"):
            groups = query_groups(self.eval_seen) if name == "test" else {}
            out[name] = {}
            for score, ranks in baseline_ranks(self.splits[name], self.zero_shot[name], self.eval_pairs[name]).items():
                hits = ranks == 1
                out[name][score] = {
                    "top1": float(hits.mean()),
                    "queries": len(hits),
                    **{
                        f"top1_{group}": float(hits[mask].mean()) if mask.any() else None
                        for group, mask in groups.items()
                    },
                }
        return out

    # -- checkpointing ----------------------------------------------------------------------------------------
    def save_last(self, epoch: int, best: dict, train_sim: torch.Tensor, rngs: list[dict]) -> None:
        """The full training state after ``epoch`` into ``last.pt``, atomically (:func:`checkpoint.training_state`)."""
        self.folder.save_state(
            training_state(epoch, self.model, self.trainer.state_dict(), best, train_sim, rngs, self.fingerprint)
        )

    def load_last(self, state: dict) -> tuple[int, dict, torch.Tensor]:
        """Restore the state of ``last.pt``; returns (next epoch, best so far, train embeddings to mine with)."""
        return restore_last(state, self.folder.last, self.model, self.trainer, self.fingerprint)

    def _selected_by_rule(self, best: dict) -> dict:
        """``best`` from ``last.pt`` as this run selects: a ``last.pt`` written before the selection metric was
        recorded holds ``val_top1`` (it selected by the reranked top-1). When that is not this run's metric, the
        best so far is kept and valued by this run's metric, and one line says so (the earlier epochs' weights are
        gone, so they cannot be compared again)."""
        if "metric" not in best:
            best = {
                **{k: v for k, v in best.items() if k != "val_top1"},
                "metric": "top1",
                "value": best.get("val_top1", -math.inf),
            }
        key = self.selection["metric"]
        if best["metric"] != key:
            log.warning(
                "%s: the epochs before the resume were selected by val %s, this run selects by val %s: the "
                "best so far (epoch %d) is kept and compared by its val %s",
                self.folder.last,
                best["metric"],
                key,
                best["epoch"],
                key,
            )
            best = {**best, "metric": key, "value": best["metrics"]["val"][key] if best.get("metrics") else -math.inf}
        return best

    # -- the run ----------------------------------------------------------------------------------------------
    def fit(self, state: dict | None = None) -> dict | None:
        """Train (from ``state``, else from ``last.pt`` when it exists) and return what ``final.json`` holds; None on
        ranks > 0."""
        with logging_redirect_tqdm():  # log lines go above the progress bars instead of through them
            return self._fit(state)

    def _start(self, state: dict | None = None) -> tuple[int, dict, torch.Tensor | None]:
        """(first epoch, best so far, the training split's sim vectors the first mining uses): from ``state`` (else
        ``last.pt``), or fresh (the sim head started from the training PCA with ``model.sim_init=pca``)."""
        state = self.folder.load_state() if state is None else state
        if state is not None:
            epoch, best, train_sim = self.load_last(state)
            best = self._selected_by_rule(best)
            dropped = self.folder.truncate(epoch - 1) if self.main else 0
            log.info(
                "resuming %s after epoch %d (%d rows of epochs after the last checkpoint dropped)",
                self.out_dir,
                epoch - 1,
                dropped,
            )
            return epoch, best, train_sim
        if self.main:
            self.folder.truncate(-1)
        best = {
            "epoch": -1,
            "metric": self.selection["metric"],
            "value": -math.inf,
            "metrics": None,
            "state": None,
            "hits": None,
        }
        if self.cfg.model.sim_init != "pca":
            return 0, best, self.embed("train").sim if self.main else None
        # every rank computes the same (float64, CPU) projection; the pooled vectors then give the first mining's
        # sim vectors too, so a trained encoder encodes the training split once here, not twice
        pooled = (
            self.pooled["train"]
            if self.frozen
            else encode_pooled(
                self.model,
                self.tokens["train"],
                self.cfg.trainer.eval_batch_size,
                self.device,
                self.amp_dtype,
                progress=self.progress,
                desc="encode train",
            )
        )
        self.model.init_sim_from_pca(pooled)
        if not self.main:
            return 0, best, None
        return 0, best, embed_pooled(self.model, pooled, self.pair_batch_size, self.device).sim

    def _log_start(self) -> None:
        cfg, rt, n, threads = self.cfg, self.runtime, distributed.world_size(), torch.get_num_threads()
        how = (
            ([rt.device_name] if rt.device.type == "cuda" else [])
            + [rt.precision]
            + (["deterministic"] if rt.deterministic else [])
            + [f"{n} process{'es' if n > 1 else ''}"]
            + ([f"{threads} CPU thread{'s' if threads > 1 else ''}"] if rt.device.type == "cpu" else [])
        )
        log.info(
            "variant %s seed %d on %s (%s) | %s | pairs train/val/test %s",
            self.variant,
            cfg.seed,
            self.device,
            ", ".join(how),
            cfg.data.name,
            "/".join(str(s.n_pairs) for s in self.splits.values()),
        )
        if self.selection["metric"] != "top1":
            log.warning(untrained_classifier_note(cfg.eval.score))
        if cfg.data.dedup:
            log.info(
                "data.dedup: dropped %s pairs that share a text with a later split (test untouched); test "
                "queries seen in train/val: %d, unseen: %d",
                self.overlap["dropped_pairs"],
                self.overlap["test_queries_seen"],
                self.overlap["test_queries_unseen"],
            )
        else:
            log.info(
                "data.dedup=false: the official splits; %d of %d test queries share a text with a training "
                "or validation pair (reported as seen/unseen)",
                self.overlap["test_queries_seen"],
                len(self.test_seen),
            )
        for name, pairs in self.eval_pairs.items():
            if pairs is not None:
                log.info(
                    "per-epoch %s metrics on a fixed sample of %d of its %d queries (eval.%s_queries)",
                    name,
                    len(pairs),
                    self.splits[name].n_pairs,
                    name,
                )
        for role, f in self.data_files.items():
            log.info("data.%s: %s (%d bytes, sha256 %s)", role, f["path"], f["bytes"], f["sha256"])
        if self.data_files:
            log.info(
                "pairs that repeat an earlier anchor and positive (each is its own query) %s; given negatives "
                "%s; per-epoch pool (data.pool=%s): %s",
                {n: c["duplicated_pairs"] for n, c in self.counts.items()},
                {n: c["with_negative"] for n, c in self.counts.items()},
                cfg.data.pool,
                POOL_TEXT[cfg.data.pool],
            )

    def _fit(self, state: dict | None) -> dict | None:
        start = time.time()
        first_epoch, best, train_sim = self.begin(state)
        epochs = self.cfg.trainer.max_epochs
        for epoch in tqdm(
            range(first_epoch, epochs), desc="epochs", disable=not self.progress, initial=first_epoch, total=epochs
        ):
            train_sim, best = self.run_epoch(epoch, train_sim, best)
        if not self.main:
            return None
        return self._finish(best, start)

    def begin(self, state: dict | None = None) -> tuple[int, dict, torch.Tensor | None]:
        """Log the run's set-up, restore or start its state (:meth:`_start`) and open the trackers (rank 0); returns
        (first epoch, best so far, the training split's sim vectors the first mining uses)."""
        self._log_start()
        first_epoch, best, train_sim = self._start(state)
        if self.main:
            self.tracker.open(first_epoch)
        return first_epoch, best, train_sim

    def run_epoch(self, epoch: int, train_sim: torch.Tensor | None, best: dict) -> tuple[torch.Tensor | None, dict]:
        """One epoch: mine, train, then (rank 0) evaluate, log and keep the best, and ``last.pt`` when due; each phase
        through :attr:`phase`. Returns (the training split's sim vectors the next epoch mines with, best so far)."""
        epoch_start = time.time()
        negatives = self.phase("mine", lambda: self.trainer.mine(epoch, train_sim))
        train_stats = self.phase("train", lambda: self.trainer.train_epoch(epoch, negatives))
        if self.main:
            stats = {**train_stats, **negatives.stats()}
            train_sim, best = self._evaluate_and_log(epoch, stats, best, epoch_start)
        epochs, every = self.cfg.trainer.max_epochs, self.cfg.trainer.checkpoint_every
        if every and ((epoch + 1) % every == 0 or epoch == epochs - 1):
            rngs = distributed.all_gather_object(rng_states())  # every rank's own RNG streams
            if self.main:
                self.phase("checkpoint", lambda: self.save_last(epoch, best, train_sim, rngs))
        distributed.barrier()
        return train_sim, best

    def _evaluate_and_log(
        self, epoch: int, train_stats: dict, best: dict, epoch_start: float
    ) -> tuple[torch.Tensor, dict]:
        """Evaluate the splits due this epoch, append their rows to ``metrics.jsonl`` and the trackers, and keep the
        best-by-val epoch (by the :attr:`selection` metric). Returns (the training split's sim vectors, which the
        next epoch mines with; best)."""
        epochs, every = self.cfg.trainer.max_epochs, self.cfg.eval.every
        names = SPLITS if (epoch + 1) % every == 0 or epoch == epochs - 1 else ("train",)
        metrics, hits, embs = self.evaluate_epoch(names, epoch)
        elapsed = time.time() - epoch_start
        base = {"variant": self.variant, "seed": int(self.cfg.seed)}
        rows = [{"epoch": epoch, "split": name, **base, **metrics[name]} for name in names]
        rows[0].update(
            train_stats, epoch_time_s=elapsed
        )  # names[0] is always train: its row carries the epoch's training
        key = self.selection["metric"]
        log.info(
            "epoch %d  loss %.4f  " % (epoch, train_stats["loss"])
            + "  ".join(f"{n} {key} {metrics[n][key]:.3f}" for n in names)
            + f"  ({elapsed:.1f} s)"
        )
        if "val" in metrics and metrics["val"][key] > best["value"]:  # the first epoch with the highest value
            best = {
                "epoch": epoch,
                "metric": key,
                "value": metrics["val"][key],
                "metrics": metrics,
                "state": self.phase("keep best", self._weights_on_cpu),
                "hits": hits["test"],
                # kept in memory for the 8 tasks at the end (recomputed there after a resume)
                "embs": {n: embs[n] for n in ("val", "test")},
            }
        self.phase("log", lambda: self._append(rows))
        return embs["train"].sim, best

    def _append(self, rows: list[dict]) -> None:
        self.folder.append(rows)  # the epoch is on disk before the state that says it is done
        self.tracker.log_rows(rows)

    def _weights_on_cpu(self) -> dict[str, torch.Tensor]:
        """A copy of the model's weights on the CPU (the best epoch's). A frozen encoder's weights never change, so they
        are taken once per run and shared by every copy (copying MiniLM's 22.7 M took 70-130 ms an epoch); on a CPU
        they are the model's own tensors, not a second 90 MB (with that copy, later epochs had several times the
        page faults, measured with ``scripts/bench.py --items frozen``)."""
        state = self.model.state_dict()
        if self.frozen and self.encoder_weights is None:
            self.encoder_weights = {
                k: v.detach().to("cpu", copy=v.device.type != "cpu") for k, v in state.items() if is_encoder_weight(k)
            }
        fixed = self.encoder_weights or {}
        return {k: fixed[k] if k in fixed else v.detach().to("cpu", copy=True) for k, v in state.items()}

    def _tasks(self, best: dict) -> dict:
        """The 8 official tasks on val and test with the (loaded) best-by-val weights, with ``eval.score``."""
        cfg, embs = self.cfg, best.get("embs", {})
        tasks = {"score": cfg.eval.score}
        for name in ("val", "test"):
            emb = embs[name] if name in embs else self.embed(name)
            groups = query_groups(self.test_seen) if name == "test" else None
            tasks[name] = evaluate_tasks(
                self.splits[name],
                cfg.eval.score,
                model=self.model,
                emb=emb,
                k=cfg.eval.k,
                device=self.device,
                batch_size=self.pair_batch_size,
                groups=groups,
                retrieve=cfg.eval.retrieve,
            )
        return tasks

    def _finish(self, best: dict, start: float) -> dict:
        """8 tasks with the best-by-val weights; best.pt, test_hits.npy, then final.json (status done)."""
        cfg = self.cfg
        self.model.load_state_dict(best["state"])
        final = {
            "status": "done",
            "variant": self.variant,
            "seed": int(cfg.seed),
            "data": cfg.data.name,
            "model": cfg.model.name,
            "selection": self.selection,
            "best_epoch": best["epoch"],
            "best": best["metrics"],
            "epochs": cfg.trainer.max_epochs,
            "pairs": {n: s.n_pairs for n, s in self.splits.items()},
            "overlap": self.overlap,
            "pool": cfg.data.pool,
            "runtime": self.runtime.record(),
        }
        if self.data_files:
            final["data_files"] = self.data_files
        if cfg.eval.tasks and self.splits["val"].supports_tasks:
            final["tasks"] = self._tasks(best)
        elif cfg.eval.tasks:
            final["tasks_skipped"] = NO_TASKS
        if self.zero_shot is not None:
            final["baselines"] = self.baselines()
        checkpoint = None
        if cfg.trainer.save_checkpoint:
            checkpoint = checkpoint_payload(
                self.model,
                self.tokenizer,
                best["state"],
                best["epoch"],
                OmegaConf.to_container(cfg.model, resolve=True),
                run={
                    "retrieve": cfg.eval.retrieve,
                    "k": int(cfg.eval.k),
                    "data": cfg.data.name,
                    "dedup": bool(cfg.data.dedup),
                    "variant": self.variant,
                    "seed": int(cfg.seed),
                },
            )
        final["wall_time_s"] = round(time.time() - start, 2)
        arrays = {"test_hits": best["hits"], "test_seen": self.eval_seen}
        if self.eval_pairs["test"] is not None:  # which test pairs the hits are of (eval.test_queries)
            arrays["test_queries"] = self.eval_pairs["test"]
        self.folder.finish(final, arrays, checkpoint, keep_last=cfg.trainer.keep_last)
        self.tracker.finish(final)
        return final


def start_up(cfg: DictConfig) -> Runtime:
    """Start-up: :func:`decide_runtime`, then the process group (only under torchrun with several processes)."""
    runtime = decide_runtime(cfg)
    distributed.setup(runtime)
    return runtime


def decide_runtime(cfg: DictConfig) -> Runtime:
    """Decide device, precision and process group once (:func:`biencoder.engine.machine.runtime.decide`) and set torch's
    determinism switches (before any CUDA work). Raises :class:`ConfigError` when the decision cannot work."""
    runtime = decide(cfg.trainer.device, cfg.trainer.precision, cfg.trainer.deterministic)
    runtime.apply()
    return runtime


def run(
    cfg: DictConfig,
    out_dir: Path,
    experiment: str = "runs",
    runtime: Runtime | None = None,
    variant: str | None = None,
) -> dict | None:
    """Train one cell into ``out_dir`` (or continue it, with ``trainer.resume``); returns what ``final.json`` holds.

    A finished folder (status ``done``) is left as it is when resuming, so a re-run sweep skips its done jobs.
    On a crash ``final.json`` says ``failed`` (or ``diverged``) with the error, the trackers close the run as
    FAILED, and the exception propagates. ``experiment``: the MLflow experiment (one per sweep). ``runtime``: the
    start-up decision (:func:`start_up`; made here when None). ``variant``: the cell's name (see :class:`Runner`).
    Rank 0 holds ``out_dir`` for the run (:func:`rundir.claim`, unless this process holds it already):
    :class:`~biencoder.engine.runs.folder.RunFolderBusy`, with nothing changed, when another process does.
    """
    validate(cfg)  # once per run, before the folder is touched (the runner trusts it)
    check_packages(cfg)
    runtime = start_up(cfg) if runtime is None else runtime
    folder = RunFolder(out_dir)
    took = distributed.is_main() and claim(folder.path)
    try:
        return _run_held(cfg, folder, experiment, runtime, variant)
    finally:
        if took:
            release(folder.path)


def _run_held(
    cfg: DictConfig, folder: RunFolder, experiment: str, runtime: Runtime, variant: str | None
) -> dict | None:
    """:func:`run` in a folder this process holds (rank 0; the others work in it through rank 0)."""
    if not distributed.is_main():
        log.setLevel(logging.WARNING)  # rank 0 speaks for the run
    done = folder.open(cfg, main=distributed.is_main(), runtime=runtime)
    if done is not None:
        return done
    state = folder.load_state()  # an unreadable last.pt is refused here, before anything in the folder changes
    runner = Runner(cfg, folder.path, experiment, runtime, variant)  # reads the corpus first
    if runner.main:
        folder.start(cfg, runtime)
    try:
        return runner.fit(state)
    except Diverged as err:
        if runner.main:
            folder.record(
                "diverged",
                variant=runner.variant,
                seed=int(cfg.seed),
                selection=runner.selection,
                epoch=err.epoch,
                what=err.what,
                loss_parts=err.parts,
                error=str(err),
            )
            runner.tracker.finish({}, "diverged")
        raise
    except BaseException as err:
        if runner.main:
            folder.record(
                "failed",
                variant=runner.variant,
                seed=int(cfg.seed),
                selection=runner.selection,
                error=f"{type(err).__name__}: {err}",
            )
            runner.tracker.finish({}, "failed")
        raise
