"""One training run's epochs: data, model, the epoch loop, the best epoch, the run folder's records.

Each epoch: mine negatives with the current weights (the training split's embeddings from the previous
epoch's evaluation are reused, so the split is embedded once per epoch), train on (point, counter, negative)
triplets (:mod:`biencoder.engine.training.epoch`), then evaluate retrieve-k-then-rerank top-1 on train, val and test
(:mod:`biencoder.engine.training.evaluation`). The run folder gets ``metrics.jsonl`` (one row per epoch and split,
fsynced per epoch), ``train.log``, ``last.pt`` (the full training state, for ``trainer.resume``, written in the
background: :mod:`biencoder.engine.runs.checkpoint`) and, at the end, ``best.pt``, ``test_hits.npy`` and ``final.json``
(atomically; ``status`` done, or failed / diverged with the error: :func:`biencoder.engine.training.run.run`) with
the 8 official tasks for the best-by-val weights. The best epoch is the first with the highest val value of the
metric that :mod:`biencoder.engine.config.selection` names (``final.json``'s ``selection``). With
``model.encoder.freeze=true`` the encoder's outputs come from the embedding cache. Under ``torchrun`` rank 0 mines,
evaluates and writes; every rank trains on its shard (DDP). No Hydra here: the runner takes a plain ``DictConfig``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch
from omegaconf import DictConfig
from tqdm.auto import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from ..config.heads import variant_name
from ..config.selection import untrained_classifier_note
from ..machine import distributed
from ..machine.rng import rng_states
from ..machine.runtime import Runtime, decide, set_seed_everywhere, show_progress
from ..modeling.encoding import Encoding, TextEncoder, embed_pooled, encode_pooled, eval_mode
from ..modeling.model import Embeddings, build_model, is_encoder_weight
from ..retrieval.rerank import Rerank
from ..runs.best import BestEpoch
from ..runs.checkpoint import checkpoint_payload, restore_last, training_state
from ..runs.folder import RunFolder
from ..runs.negative_log import log_negatives
from ..runs.tracking import Tracker
from .epoch import EpochTrainer
from .evaluation import SPLITS, Evaluation
from .inputs import EncoderInputs, RunData
from .settings import EvalSettings, RunSettings, TrainingSettings

log = logging.getLogger("biencoder")
T = TypeVar("T")


def untimed(name: str, fn: Callable[[], T]) -> T:
    """The default :attr:`Runner.phase`: runs ``fn`` (``scripts/bench.py`` puts a timer in its place)."""
    return fn()


class Runner:
    """Holds one run's model, data and state; :meth:`fit` runs it end to end (resuming from ``last.pt``).

    ``runtime``: the start-up decision of device, precision and process group (:func:`start_up`, made here when
    None); the runner never asks torch again. ``variant``: the cell's name (the app passes Hydra's ``+variant=``
    choice; default: named after the head flags, :func:`heads.variant_name`). The config is trusted:
    :func:`biencoder.engine.training.run.run` validates it once.
    """

    def __init__(
        self,
        cfg: DictConfig,
        out_dir: Path,
        experiment: str = "runs",
        runtime: Runtime | None = None,
        variant: str | None = None,
    ):
        self.created = time.time()  # the run's wall time counts its set-up (a frozen encoder's encoding) too
        self.out_dir = Path(out_dir)
        self.settings, scoring = RunSettings.of_run(cfg), EvalSettings.of_run(cfg)  # the config, read once
        self.folder = RunFolder(out_dir)
        self.data = RunData.read(cfg.data)
        self.runtime = start_up(cfg) if runtime is None else runtime  # decided once, at start-up
        self.device = self.runtime.device
        self.main = distributed.is_main()
        self.variant = variant_name(cfg, variant)
        self.selection = scoring.selection  # what picks the best epoch (final.json's "selection")
        self._log_header()  # first, before the set-up's long phases (loading, encoding) say what they do
        self.tracker = Tracker(cfg, self.out_dir, experiment, self.variant)  # opened on rank 0 when training starts
        shown = show_progress(cfg)
        set_seed_everywhere(cfg.seed)
        self.model, self.tokenizer = build_model(cfg.model, progress=shown)  # the tokenizer: saved into best.pt
        self.model.to(self.device)
        self.progress = shown and self.main
        self.frozen = bool(cfg.model.encoder.freeze)
        self.encoding = Encoding.of_run(cfg.trainer, self.runtime, self.progress)
        self.rerank = Rerank.of_run(cfg.eval, self.runtime)
        # how texts become vectors: max_length, the embedding and token caches under trainer.cache_dir
        self.text_encoder = TextEncoder(
            self.model, self.tokenizer, cfg.model.max_length, self.encoding, cfg.trainer.cache_dir
        )
        self.inputs = EncoderInputs.make(self.text_encoder, self.data.splits, self.frozen)
        training = self.inputs.training_inputs(self.data.splits["train"], self.text_encoder)
        settings = TrainingSettings.of_run(cfg, self.runtime)
        self.trainer = EpochTrainer(settings, self.model, training, self.runtime, self.progress)
        self.evaluation = Evaluation(scoring, self.model, self.data, self.inputs, self.encoding, self.rerank)
        self.encoder_weights: dict[str, torch.Tensor] | None = None  # a frozen encoder's, taken once (_weights_on_cpu)
        # (name, fn) -> fn(), around each phase of an epoch: the bench times the runner's own epoch through it
        self.phase: Callable[[str, Callable[[], Any]], Any] = untimed

    # -- the run ----------------------------------------------------------------------------------------------
    def fit(self, state: dict | None = None) -> dict | None:
        """Train (from ``state``, else from ``last.pt`` when it exists) and return what ``final.json`` holds; None on
        ranks > 0."""
        # log lines go above the progress bars instead of through them; a failed run waits for the last.pt write
        with logging_redirect_tqdm(), self.folder.last_writer.waiting_on_error():
            return self._fit(state)

    def _fit(self, state: dict | None) -> dict | None:
        first_epoch, best, train_sim = self.begin(state)
        epochs = self.settings.max_epochs
        for epoch in tqdm(
            range(first_epoch, epochs), desc="epochs", disable=not self.progress, initial=first_epoch, total=epochs
        ):
            train_sim, best = self.run_epoch(epoch, train_sim, best)
        if not self.main:
            return None
        return self._finish(best)

    def begin(self, state: dict | None = None) -> tuple[int, dict, torch.Tensor | None]:
        """Log the run's set-up, restore or start its state (:meth:`_start`) and open the trackers (rank 0); returns
        (first epoch, best so far, the training split's sim vectors the first mining uses)."""
        self._log_start()
        first_epoch, best, train_sim = self._start(state)
        if self.main:
            self.tracker.open(first_epoch)
        return first_epoch, best, train_sim

    def _start(self, state: dict | None = None) -> tuple[int, dict, torch.Tensor | None]:
        """(first epoch, best so far, the training split's sim vectors the first mining uses): from ``state`` (else
        ``last.pt``), or fresh (the sim head started from the training PCA with ``model.sim_init=pca``)."""
        state = self.folder.load_state() if state is None else state
        if state is not None:
            epoch, best, train_sim = self.load_last(state)
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
        metric = self.selection["metric"]
        best = BestEpoch(metric)
        if not self.settings.pca_init:
            return 0, best, self.evaluation.embed("train").sim if self.main else None
        # every rank computes the same (float64, CPU) projection; the pooled vectors then give the first mining's
        # sim vectors too, so a trained encoder encodes the training split once here, not twice
        pooled = (
            self.inputs.pooled["train"]
            if self.frozen
            else encode_pooled(self.model, self.inputs.tokens["train"], self.encoding, "encode train")
        )
        self.model.init_sim_from_pca(pooled)
        if not self.main:
            return 0, best, None
        return 0, best, embed_pooled(self.model, pooled, self.rerank.batch_size, self.device).sim

    def _log_start(self) -> None:
        """The rest of the run's set-up in ``train.log`` once it is made (the header came first): the note of an
        untrained classifier, then the data (:meth:`RunData.log`)."""
        if self.selection["metric"] == "retrieval_top1":  # selection()'s rule for an untrained classifier
            log.warning(untrained_classifier_note(self.evaluation.settings.score))
        self.data.log(self.evaluation.pairs)

    def _log_header(self) -> None:
        """The run's first line in ``train.log``: cell, seed, machine and pairs."""
        log.info(
            "variant %s seed %d on %s (%s) | %s | pairs train/val/test %s",
            self.variant,
            self.settings.seed,
            self.device,
            self.runtime.describe(distributed.world_size(), torch.get_num_threads()),
            self.settings.record["data"],
            "/".join(str(s.n_pairs) for s in self.data.splits.values()),
        )

    # -- one epoch --------------------------------------------------------------------------------------------
    def run_epoch(
        self, epoch: int, train_sim: torch.Tensor | None, best: BestEpoch
    ) -> tuple[torch.Tensor | None, BestEpoch]:
        """One epoch: mine, train, then (rank 0) evaluate, log and keep the best, and ``last.pt`` when due; each phase
        through :attr:`phase`. Returns (the training split's sim vectors the next epoch mines with, best so far)."""
        epoch_start = time.time()
        negatives = self.phase("mine", lambda: self.trainer.mine(epoch, train_sim))
        if self.main and self.settings.log_negatives:  # what this epoch mined, in the run folder
            self.phase("log negatives", lambda: log_negatives(self.out_dir, epoch, train_sim, self.trainer, negatives))
        train_stats = self.phase("train", lambda: self.trainer.train_epoch(epoch, negatives))
        if self.main:
            stats = {**train_stats, **negatives.stats()}
            train_sim, best = self._evaluate_and_log(epoch, stats, best, epoch_start)
        epochs, every = self.settings.max_epochs, self.settings.checkpoint_every
        if every and ((epoch + 1) % every == 0 or epoch == epochs - 1):
            rngs = distributed.all_gather_object(rng_states())  # every rank's own RNG streams
            if self.main:
                self.phase("checkpoint", lambda: self.save_last(epoch, best, train_sim, rngs))
        distributed.barrier()
        return train_sim, best

    def evaluate_epoch(self, names, epoch: int = -1) -> tuple[dict[str, dict], dict, dict[str, Embeddings]]:
        """(metrics, per-query hits, embeddings) per split of ``names`` (:meth:`Evaluation.evaluate_split`), each
        split's encoding and its retrieve+rerank a phase of their own."""
        metrics, hits, embs = {}, {}, {}
        evaluation = self.evaluation
        with eval_mode(self.model):  # once for every split, not twice per split
            for name in names:
                embs[name] = self.phase(f"encode {name}", lambda name=name: evaluation.embed(name))
                metrics[name], hits[name] = self.phase(
                    f"retrieve+rerank {name}", lambda name=name: evaluation.evaluate_split(name, embs[name], epoch)
                )
        return metrics, hits, embs

    def _evaluate_and_log(
        self, epoch: int, train_stats: dict, best: BestEpoch, epoch_start: float
    ) -> tuple[torch.Tensor, BestEpoch]:
        """Evaluate the splits due this epoch, append their rows to ``metrics.jsonl`` and the trackers, and keep the
        best-by-val epoch (by the :attr:`selection` metric). Returns (the training split's sim vectors, which the
        next epoch mines with; best)."""
        epochs, every = self.settings.max_epochs, self.settings.eval_every
        names = SPLITS if (epoch + 1) % every == 0 or epoch == epochs - 1 else ("train",)
        metrics, hits, embs = self.evaluate_epoch(names, epoch)
        elapsed = time.time() - epoch_start
        base = {"variant": self.variant, "seed": self.settings.seed}
        rows = [{"epoch": epoch, "split": name, **base, **metrics[name]} for name in names]
        rows[0].update(train_stats, epoch_time_s=elapsed)  # names[0] is always train: its row carries the training
        key = self.selection["metric"]
        log.info(
            f"epoch {epoch}  loss {train_stats['loss']:.4f}  "
            + "  ".join(f"{n} {key} {metrics[n][key]:.3f}" for n in names)
            + f"  ({elapsed:.1f} s)"
        )
        if "val" in metrics and best.improved_by(metrics["val"]):
            best = BestEpoch(
                key,
                epoch,
                metrics["val"][key],
                metrics,
                self.phase("keep best", self._weights_on_cpu),
                hits["test"],
                embs={n: embs[n] for n in ("val", "test")},
            )
        self.phase("log", lambda: self._append(rows))
        return embs["train"].sim, best

    def _append(self, rows: list[dict]) -> None:
        self.folder.append(rows)  # the epoch is on disk before the state that says it is done
        self.tracker.log_rows(rows)

    def _weights_on_cpu(self) -> dict[str, torch.Tensor]:
        """A copy of the model's weights on the CPU (the best epoch's). A frozen encoder's weights never change, so
        they are taken once per run and shared by every copy; on a CPU they are the model's own tensors, not a second
        copy of them (BENCHMARKS.md, "Design choices, measured")."""
        state = self.model.state_dict()
        if self.frozen and self.encoder_weights is None:
            self.encoder_weights = {
                k: v.detach().to("cpu", copy=v.device.type != "cpu") for k, v in state.items() if is_encoder_weight(k)
            }
        fixed = self.encoder_weights or {}
        return {k: fixed[k] if k in fixed else v.detach().to("cpu", copy=True) for k, v in state.items()}

    # -- checkpointing ----------------------------------------------------------------------------------------
    def save_last(self, epoch: int, best: BestEpoch, train_sim: torch.Tensor, rngs: list[dict]) -> None:
        """The full training state after ``epoch`` into ``last.pt`` (:func:`checkpoint.training_state`): copied here,
        written atomically in the background (:meth:`RunFolder.save_state`; the run's end or failure waits for it)."""
        fingerprint = self.inputs.fingerprint
        self.folder.save_state(training_state(epoch, self.trainer, best, train_sim, rngs, fingerprint))

    def load_last(self, state: dict) -> tuple[int, dict, torch.Tensor]:
        """Restore the state of ``last.pt``; returns (next epoch, best so far as this run selects
        (:meth:`BestEpoch.valued_by`), train embeddings to mine with)."""
        epoch, best, train_sim = restore_last(state, self.folder.last, self.trainer, self.inputs.fingerprint)
        return epoch, best.valued_by(self.selection["metric"], str(self.folder.last)), train_sim

    # -- the end ----------------------------------------------------------------------------------------------
    def _finish(self, best: BestEpoch) -> dict:
        """8 tasks with the best-by-val weights; best.pt, test_hits.npy, test.run.gz, then final.json (status done)."""
        self.model.load_state_dict(best.state)
        final = self._final(best)
        settings = self.settings
        checkpoint = self._best_checkpoint(best) if settings.save_checkpoint else None
        final["wall_time_s"] = round(time.time() - self.created, 2)  # from the runner's set-up on
        arrays = {"test_hits": best.hits, "test_seen": self.evaluation.seen}
        test_pairs = self.evaluation.pairs["test"]
        if test_pairs is not None:  # which test pairs the hits are of (eval.test_queries)
            arrays["test_queries"] = test_pairs
        texts = self.evaluation.trec_files(best, f"biencoder-{self.variant}-s{settings.seed}")
        self.folder.finish(final, arrays, checkpoint, keep_last=settings.keep_last, texts=texts)
        self.tracker.finish(final)
        return final

    def _final(self, best: BestEpoch) -> dict:
        """What ``final.json`` holds but the wall time, the best-by-val weights loaded: the run, its best epoch, its
        data, its runtime, and the end's scores (:meth:`Evaluation.final_scores`)."""
        settings = self.settings
        final = {
            "status": "done",
            "variant": self.variant,
            "seed": settings.seed,
            "data": settings.record["data"],
            "model": settings.record["model"],
            "selection": self.selection,
            "best_epoch": best.epoch,
            "best": best.metrics,
            "epochs": settings.max_epochs,
            "pairs": {n: s.n_pairs for n, s in self.data.splits.items()},
            "overlap": self.data.overlap,
            "pool": self.data.pool,
            "runtime": self.runtime.record(),
        }
        if self.data.files:
            final["data_files"] = self.data.files
        return {**final, **self.evaluation.final_scores(best)}

    def _best_checkpoint(self, best: BestEpoch) -> dict:
        """``best.pt``'s content: the best epoch's weights, the model config and the run's retrieval settings."""
        run = {**self.settings.retrieval, "variant": self.variant, "seed": self.settings.seed}
        return checkpoint_payload(self.model, self.tokenizer, best.state, best.epoch, self.settings.model, run)


def start_up(cfg: DictConfig) -> Runtime:
    """Start-up: :func:`decide_runtime`, then the process group (only under torchrun with several processes)."""
    runtime = decide_runtime(cfg)
    distributed.setup(runtime)
    return runtime


def decide_runtime(cfg: DictConfig) -> Runtime:
    """Decide device, precision and process group once (:func:`biencoder.engine.machine.runtime.decide`) and set
    torch's determinism switches (before any CUDA work). Raises :class:`ConfigError` when the decision cannot work."""
    runtime = decide(cfg.trainer.device, cfg.trainer.precision, cfg.trainer.deterministic)
    runtime.apply()
    return runtime
