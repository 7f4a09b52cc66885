"""Train one ablation cell: ``python -m biencoder.train +variant=ln_relu`` (sweep: ``-m '+variant=glob(*)' seed=0,1,2``).

Each epoch: mine negatives with the current weights (the training split's embeddings from the previous
epoch's evaluation are reused, so the split is embedded once per epoch), train on (point, counter, negative)
triplets, then evaluate retrieve-k-then-rerank top-1 on train, val and test. The run folder gets
``metrics.jsonl`` (one row per epoch and split, flushed), ``train.log``, ``best.pt``, ``test_hits.npy`` and,
at the end, ``final.json`` (written atomically) with the 8 official tasks for the best-by-val weights.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path

import hydra
import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from .config import (ConfigError, fail, register_resolvers, select_device, set_seed_everywhere, validate,
                     variant_name, write_json_atomic)
from .corpus import CorpusError, PairedSplit, read_corpus
from .evaluate import retrieve_rerank
from .loss import TripletCELoss
from .model import Embeddings, TokenizedTexts, build_model, encode, head_statistics
from .negatives import MinedNegatives, mine_negatives, random_rate
from .tasks import evaluate_tasks, format_tasks

log = logging.getLogger("biencoder")
SPLITS = ("train", "val", "test")


class TripletCollate:
    """Rows [B, 3] of (point, counter, negative) → one padded encoder batch of 3B texts, plus the rows."""

    def __init__(self, tokens: TokenizedTexts):
        self.tokens = tokens

    def __call__(self, rows: list[np.ndarray]) -> dict[str, torch.Tensor]:
        rows = np.stack(rows)
        batch = self.tokens.batch(rows.T.ravel())  # all points, then all counters, then all negatives
        batch["rows"] = torch.from_numpy(rows)
        return batch


def triplet_rows(split: PairedSplit, negatives: MinedNegatives) -> np.ndarray:
    """[Q, 3] table rows (point, counter, negative) for this epoch: always built from the freshly mined ones."""
    return np.stack([split.query, split.counter, negatives.row], axis=1)


def _grad_norm(params) -> float:
    """L2 norm over the gradients of ``params`` (after backward, before the step)."""
    norms = [p.grad.detach().norm() for p in params if p.grad is not None]
    return torch.linalg.vector_norm(torch.stack(norms)).item() if norms else 0.0


class JsonlLogger:
    """Appends one JSON object per line and flushes it, so a crashed run keeps every finished epoch."""

    def __init__(self, path: Path):
        self.file = open(path, "a", encoding="utf-8")

    def write(self, row: dict) -> None:
        self.file.write(json.dumps(row) + "\n")
        self.file.flush()

    def __enter__(self) -> "JsonlLogger":
        return self

    def __exit__(self, *exc) -> None:
        self.file.close()


class Runner:
    """Holds one run's model, data and state; :meth:`fit` runs it end to end."""

    def __init__(self, cfg: DictConfig, out_dir: Path):
        validate(cfg)
        self.cfg, self.out_dir = cfg, Path(out_dir)
        corpus = read_corpus(cfg.data.root)
        self.device = select_device(cfg.trainer.device)
        self.variant = variant_name(cfg)
        set_seed_everywhere(cfg.seed)
        self.model, tokenizer = build_model(cfg.model, progress=bool(cfg.trainer.progress))
        self.model.to(self.device)
        self.splits = {name: corpus.paired(name, cfg.data.max_debates) for name in SPLITS}
        self.tokens = {name: TokenizedTexts(s.texts, tokenizer, cfg.model.max_length) for name, s in self.splits.items()}
        self.loss_fn = TripletCELoss(cfg.loss.margin, cfg.loss.triplet_weight, cfg.loss.ce_weight)
        self.optimizer = torch.optim.AdamW(
            [{"params": self.model.encoder.parameters(), "lr": cfg.trainer.lr},
             {"params": self.model.head_parameters(), "lr": cfg.trainer.head_lr}],
            weight_decay=cfg.trainer.weight_decay,
        )
        self.rng = np.random.default_rng(cfg.seed)
        self.loader_generator = torch.Generator().manual_seed(cfg.seed)
        self.progress = bool(cfg.trainer.progress)
        self.amp_dtype = torch.bfloat16 if str(cfg.trainer.precision) == "bf16" else None

    # -- pieces -----------------------------------------------------------------------------------------------
    def embed(self, name: str) -> Embeddings:
        return encode(self.model, self.tokens[name], self.cfg.trainer.eval_batch_size, self.device,
                      self.amp_dtype, progress=self.progress, desc=f"encode {name}")

    def mine(self, epoch: int, train_emb: Embeddings) -> MinedNegatives:
        rate = random_rate(epoch, self.cfg.negatives.random_rate.start, self.cfg.negatives.random_rate.decay)
        return mine_negatives(train_emb.sim.numpy(), self.splits["train"], rate, self.rng, self.cfg.negatives.n_neighbors)

    def train_epoch(self, epoch: int, negatives: MinedNegatives) -> dict[str, float]:
        """One pass over the training pairs with this epoch's negatives; returns mean loss parts and internals."""
        cfg = self.cfg.trainer
        loader = DataLoader(list(triplet_rows(self.splits["train"], negatives)), batch_size=cfg.batch_size,
                            shuffle=True, generator=self.loader_generator, num_workers=cfg.num_workers,
                            collate_fn=TripletCollate(self.tokens["train"]))
        encoder_params = list(self.model.encoder.parameters())
        head_params = self.model.head_parameters()
        sums: dict[str, float] = {}
        self.model.train()
        bar = tqdm(loader, desc=f"epoch {epoch} train", disable=not self.progress, leave=False)
        for batch in bar:
            batch.pop("rows")  # kept in the batch for inspection (tests check them against the mined negatives)
            batch = {k: v.to(self.device) for k, v in batch.items()}
            with torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.amp_dtype is not None):
                point, counter, negative = self.model.embed(**batch).chunk(3)  # collate order: P, C, N
                out = self.loss_fn(self.model, point, counter, negative)
            self.optimizer.zero_grad(set_to_none=True)
            out.total.backward()
            stats = {**out.parts, **head_statistics(out.features, out.head_input),
                     "grad_norm_encoder": _grad_norm(encoder_params), "grad_norm_head": _grad_norm(head_params)}
            self.optimizer.step()
            for key, value in stats.items():
                sums[key] = sums.get(key, 0.0) + value
            bar.set_postfix(loss=f"{out.parts['loss']:.3f}")
        return {key: value / len(loader) for key, value in sums.items()}

    def evaluate_epoch(self, names) -> tuple[dict[str, dict], dict[str, np.ndarray], dict[str, Embeddings]]:
        metrics, hits, embs = {}, {}, {}
        for name in names:
            embs[name] = self.embed(name)
            metrics[name], hits[name] = retrieve_rerank(self.model, embs[name], self.splits[name], self.cfg.eval.k,
                                                        self.cfg.eval.pair_batch_size, self.device)
        return metrics, hits, embs

    # -- the run ----------------------------------------------------------------------------------------------
    def fit(self) -> dict:
        with logging_redirect_tqdm():  # log lines go above the progress bars instead of through them
            return self._fit()

    def _fit(self) -> dict:
        cfg, start = self.cfg, time.time()
        base = {"variant": self.variant, "seed": int(cfg.seed)}
        log.info("variant %s seed %d on %s | %s | pairs train/val/test %s", self.variant, cfg.seed, self.device,
                 cfg.data.name, "/".join(str(s.n_pairs) for s in self.splits.values()))
        best = {"epoch": -1, "val_top1": -math.inf}
        train_emb = self.embed("train")
        with JsonlLogger(self.out_dir / "metrics.jsonl") as metrics_log:
            for epoch in tqdm(range(cfg.trainer.max_epochs), desc="epochs", disable=not self.progress):
                epoch_start = time.time()
                negatives = self.mine(epoch, train_emb)
                train_stats = self.train_epoch(epoch, negatives)
                last = epoch == cfg.trainer.max_epochs - 1
                names = SPLITS if (epoch + 1) % cfg.eval.every == 0 or last else ("train",)
                metrics, hits, embs = self.evaluate_epoch(names)
                train_emb = embs["train"]  # the next epoch mines with these
                elapsed = time.time() - epoch_start
                for name in names:
                    row = {"epoch": epoch, "split": name, **base, **metrics[name]}
                    if name == "train":
                        row.update(train_stats, **negatives.stats(), epoch_time_s=elapsed)
                    metrics_log.write(row)
                log.info("epoch %d  loss %.4f  " % (epoch, train_stats["loss"]) + "  ".join(
                    f"{n} top1 {metrics[n]['top1']:.3f}" for n in names) + f"  ({elapsed:.1f} s)")
                if "val" in metrics and metrics["val"]["top1"] > best["val_top1"]:
                    # the val/test embeddings of this epoch serve the final 8-task evaluation as they are
                    best = {"epoch": epoch, "val_top1": metrics["val"]["top1"], "metrics": metrics, "embs": embs}
                    best_state = {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}
                    np.save(self.out_dir / "test_hits.npy", hits["test"])
                    if cfg.trainer.save_checkpoint:
                        torch.save({"state_dict": best_state, "epoch": epoch,
                                    "model_cfg": OmegaConf.to_container(cfg.model, resolve=True)},
                                   self.out_dir / "best.pt")

        self.model.load_state_dict(best_state)
        final = {"status": "completed", **base, "data": cfg.data.name, "model": cfg.model.name,
                 "best_epoch": best["epoch"], "best": best["metrics"], "epochs": cfg.trainer.max_epochs}
        if cfg.eval.tasks:
            final["tasks"] = {"score": cfg.eval.score}
            for name in ("val", "test"):
                final["tasks"][name] = evaluate_tasks(self.splits[name], cfg.eval.score, model=self.model,
                                                      emb=best["embs"][name], k=cfg.eval.k, device=self.device,
                                                      batch_size=cfg.eval.pair_batch_size)
        final["wall_time_s"] = round(time.time() - start, 2)
        write_json_atomic(self.out_dir / "final.json", final)
        log.info("\n%s", summary_text(final, self.out_dir))
        return final


def summary_text(final: dict, out_dir: Path) -> str:
    """The one-screen summary printed at the end of a run."""
    lines = [f"== {final['variant']} seed {final['seed']} | {final['model']} on {final['data']} | "
             f"best epoch {final['best_epoch']} of {final['epochs']} | {final['wall_time_s']:.0f} s",
             f"{'split':<6} {'top1':>7} {'retr@1':>7} {'R@k':>7} {'MRR':>7}"]
    for name, m in final["best"].items():
        lines.append(f"{name:<6} {m['top1']:>7.3f} {m['retrieval_top1']:>7.3f} {m['recall_at_k']:>7.3f} {m['mrr']:>7.3f}")
    if "tasks" in final:
        lines.append(f"8 tasks, score={final['tasks']['score']}, best-by-val weights:")
        lines.append(format_tasks({n: final["tasks"][n] for n in ("val", "test")}))
    lines.append(f"run folder: {out_dir}")
    return "\n".join(lines)


def _attach_file_log(out_dir: Path) -> None:
    target = (out_dir / "train.log").resolve()
    handlers = logging.getLogger().handlers + log.handlers
    if not any(isinstance(h, logging.FileHandler) and Path(h.baseFilename) == target for h in handlers):
        handler = logging.FileHandler(target)
        handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)


def run(cfg: DictConfig, out_dir: Path) -> dict:
    """Train one cell into ``out_dir`` and return what ``final.json`` holds."""
    out_dir.mkdir(parents=True, exist_ok=True)
    _attach_file_log(out_dir)
    runner = Runner(cfg, out_dir)  # validates the config and reads the corpus first
    # .hydra/config.yaml keeps interpolations (${minilm_path:}, ${oc.env:...}); this copy says what was used
    OmegaConf.save(cfg, out_dir / "config_resolved.yaml", resolve=True)
    return runner.fit()


register_resolvers()


@hydra.main(version_base="1.3", config_path="../../conf", config_name="config")
def main(cfg: DictConfig) -> float:
    from hydra.core.hydra_config import HydraConfig

    out_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        final = run(cfg, out_dir)
    except (ConfigError, CorpusError) as err:
        fail(err, out_dir)
    return final["best"]["val"]["top1"]


if __name__ == "__main__":
    main()
