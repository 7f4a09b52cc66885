"""Evaluation: the per-epoch retrieve-k-then-rerank top-1, and the ``python -m biencoder.evaluate`` app.

Per-epoch protocol (``../shared/docs/protocol.md``): for every query point of a split the candidate pool is
every argument of the split that belongs to a pair, except the query itself and the counters whose text equals
its true counter's (textual duplicates of the true counter count as that counter). The k nearest candidates by
Euclidean distance of the sim embeddings (BallTree) are rescored by the classifier's P(positive).
"""

from __future__ import annotations

import logging
import resource
import time
from pathlib import Path

import hydra
import numpy as np
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from sklearn.neighbors import BallTree

from .config import ConfigError, fail, register_resolvers, select_device, set_seed_everywhere, validate, write_json_atomic
from .corpus import CorpusError, PairedSplit, read_corpus
from .model import BiModel, Embeddings, TokenizedTexts, build_model, encode, pair_probabilities
from .tasks import evaluate_tasks, format_tasks

log = logging.getLogger("biencoder")


def retrieve(sim: np.ndarray, split: PairedSplit, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k nearest candidates per query by sim distance (BallTree over all rows of ``split``).

    Args: sim [2Q, D]. Returns (rows [Q, k'], distances [Q, k']) nearest first, k' = min(k, smallest pool).
    """
    extra = 1 + int(split.twins_of_true_counter().max())  # the query itself and its true counter's twins
    k = min(k, len(sim) - extra)
    sim = np.asarray(sim, dtype=np.float64)
    dist, rows = BallTree(sim).query(sim[split.query], k=min(k + extra, len(sim)))
    keep = split.is_candidate(rows)
    # at most `extra` of the k + extra neighbours are dropped, so each query keeps at least k, nearest first
    order = np.argsort(~keep, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(rows, order, 1), np.take_along_axis(dist, order, 1)


def retrieve_rerank(model: BiModel, emb: Embeddings, split: PairedSplit, k: int = 10,
                    batch_size: int = 16384, device="cpu") -> tuple[dict[str, float], np.ndarray]:
    """Per-epoch top-1 over every query of ``split``.

    Args: ``emb`` — :class:`Embeddings` of all 2Q rows of ``split`` (computed once per split per epoch).
    Returns (metrics, hits): ``top1`` (reranked; ties count against the true counter), ``retrieval_top1``
    (nearest neighbour), ``recall_at_k`` (true counter among the k), ``mrr`` (reciprocal rank of the true
    counter after reranking the k; 0 when it is not among them), ``queries``, ``k``; ``hits`` [Q] bool is the
    reranked top-1 outcome per query.
    """
    rows, _ = retrieve(emb.sim.numpy(), split, k)
    n_q, k_eff = rows.shape
    queries = np.repeat(split.query, k_eff)
    probs = pair_probabilities(model, emb, queries, rows.ravel(), batch_size, device).reshape(n_q, k_eff)
    is_true = rows == split.counter[:, None]
    in_k = is_true.any(axis=1)
    true_prob = np.where(in_k, (probs * is_true).sum(axis=1), -np.inf)
    # rank 1 only if every other retrieved candidate scores strictly lower
    rank = 1 + ((probs >= true_prob[:, None]) & ~is_true).sum(axis=1)
    hits = in_k & (rank == 1)
    metrics = {
        "top1": float(hits.mean()),
        "retrieval_top1": float(is_true[:, 0].mean()),
        "recall_at_k": float(in_k.mean()),
        "mrr": float(np.where(in_k, 1.0 / rank, 0.0).mean()),
        "queries": int(n_q),
        "k": int(k_eff),
    }
    return metrics, hits


# -- python -m biencoder.evaluate ---------------------------------------------------------------------------------
NEEDS_TRAINED = ("rerank", "classifier", "sim")


def load_checkpoint(path: str | Path, progress: bool = True) -> tuple[BiModel, object, dict]:
    """(model, tokenizer, model config) from a run folder (its ``best.pt``) or a ``best.pt`` file."""
    path = Path(path)
    file = path / "best.pt" if path.is_dir() else path
    if not file.is_file():
        raise ConfigError(f"eval.checkpoint='{path}' has no best.pt: pass a run folder of biencoder.train or its best.pt")
    ckpt = torch.load(file, map_location="cpu", weights_only=True)
    model, tokenizer = build_model(ckpt["model_cfg"], progress)
    model.load_state_dict(ckpt["state_dict"])
    return model, tokenizer, ckpt["model_cfg"]


def run_evaluation(cfg: DictConfig, out_dir: Path) -> dict:
    """The 8 tasks on ``eval.split`` with ``eval.score``; writes JSON to ``eval.output`` (default in out_dir)."""
    start = time.time()
    validate(cfg)
    score, split_name = cfg.eval.score, cfg.eval.split
    if split_name not in ("train", "val", "test"):
        raise ConfigError(f"eval.split={split_name!r} is not valid: use val or test (or train)")
    if cfg.eval.checkpoint is None and score in NEEDS_TRAINED:
        raise ConfigError(f"eval.score={score} needs trained weights: pass eval.checkpoint=<run folder or best.pt>, "
                          "or use eval.score=encoder_cosine (zero-shot) or eval.score=tfidf")
    split = read_corpus(cfg.data.root).paired(split_name, cfg.data.max_debates)
    device = select_device(cfg.trainer.device)
    set_seed_everywhere(cfg.seed)
    model = emb = None
    model_cfg = OmegaConf.to_container(cfg.model, resolve=True)
    if score != "tfidf":
        if cfg.eval.checkpoint is not None:
            model, tokenizer, model_cfg = load_checkpoint(cfg.eval.checkpoint, progress=bool(cfg.trainer.progress))
        else:
            model, tokenizer = build_model(cfg.model, progress=bool(cfg.trainer.progress))
        model.to(device)
        tokens = TokenizedTexts(split.texts, tokenizer, model_cfg["max_length"])
        emb = encode(model, tokens, cfg.trainer.eval_batch_size, device, progress=bool(cfg.trainer.progress),
                     desc=f"encode {split_name}")
    tasks = evaluate_tasks(split, score, model=model, emb=emb, k=cfg.eval.k, device=device,
                           batch_size=cfg.eval.pair_batch_size)
    result = {
        "score": score,
        "split": split_name,
        "data": cfg.data.name,
        "checkpoint": None if cfg.eval.checkpoint is None else str(cfg.eval.checkpoint),
        "encoder": None if score == "tfidf" else model_cfg["encoder"]["name_or_path"],
        "pooling": None if score == "tfidf" else model_cfg["pooling"],
        "tasks": tasks,
        "wall_time_s": round(time.time() - start, 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    output = Path(cfg.eval.output) if cfg.eval.output else out_dir / "eval.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(output, result)
    log.info("8 tasks on %s, score=%s (%.1f s, peak RSS %.0f MB)\n%s\nwritten to %s", split_name, score,
             result["wall_time_s"], result["peak_rss_mb"], format_tasks({split_name: tasks}), output)
    return result


register_resolvers()


@hydra.main(version_base="1.3", config_path="../../conf", config_name="evaluate")
def main(cfg: DictConfig) -> None:
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        run_evaluation(cfg, out_dir)
    except (ConfigError, CorpusError) as err:
        fail(err, out_dir)


if __name__ == "__main__":
    main()
