"""Evaluation: the per-epoch retrieve-k-then-rerank top-1, and the ``python -m biencoder.evaluate`` app.

Per-epoch protocol (``../shared/docs/protocol.md``): for every query point of a split the candidate pool is
every argument of the split that belongs to a pair, except the query itself and the counters whose text equals
its true counter's (textual duplicates of the true counter count as that counter). The k nearest candidates by
Euclidean distance of the sim embeddings (``eval.index``: exact search, or a BallTree; or by the encoder's cosine,
``eval.retrieve=encoder``) are rescored by the classifier (its logit margin l1 − l0,
which orders them as P(positive) does, without float32 ties).
"""

from __future__ import annotations

import logging
import resource
import time
from pathlib import Path

import hydra
import numpy as np
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from .cache import cached_pooled, encoder_fingerprint
from .checkpoint import load_checkpoint
from .config import (
    ConfigError,
    conf_dir,
    fail,
    hydra_cli,
    register,
    set_seed_everywhere,
    show_progress,
    validate,
)
from .corpus import CorpusError, PairedSplit, read_corpus, seen_queries
from .corpus import split_name as canonical_split
from .errors import BiencoderError
from .model import (
    BiModel,
    Embeddings,
    TokenizedTexts,
    build_model,
    embed_pooled,
    encode_pooled,
    pair_margins,
)
from .runtime import decide
from .search import NeighbourIndex
from .state import write_json_atomic
from .tasks import evaluate_tasks, format_tasks

log = logging.getLogger("biencoder")


def retrieve(sim: np.ndarray, split: PairedSplit, k: int, index: str = "balltree",
             device="cpu", pairs: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The k nearest candidates per query by sim distance (a BallTree, or exact search, over all rows of ``split``).

    Args: sim [2Q, D]; ``pairs``: the queries (indices of pairs; default all). Returns (rows [P, k'],
    distances [P, k']) nearest first, k' = min(k, smallest pool).
    """
    pairs = np.arange(split.n_pairs) if pairs is None else np.asarray(pairs)
    extra = 1 + int(split.twins_of_true_counter().max())  # the query itself and its true counter's twins
    k = min(k, len(sim) - extra)
    sim = np.asarray(sim, dtype=np.float64)
    dist, rows = NeighbourIndex(sim, index, device).query(sim[split.query[pairs]], k + extra)
    keep = split.is_candidate(rows, pairs)
    # at most `extra` of the k + extra neighbours are dropped, so each query keeps at least k, nearest first
    order = np.argsort(~keep, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(rows, order, 1), np.take_along_axis(dist, order, 1)


def retrieve_rerank(model: BiModel, emb: Embeddings, split: PairedSplit, k: int = 10, batch_size: int = 4096,
                    device="cpu", index: str = "balltree", pairs: np.ndarray | None = None,
                    space: str = "sim") -> tuple[dict[str, float], np.ndarray]:
    """Per-epoch top-1 over every query of ``split`` (or over the queries of ``pairs``, indices of pairs).

    Args: ``emb`` — :class:`Embeddings` of all 2Q rows of ``split`` (computed once per split per epoch); the pool
    of every query is always the whole split. ``space``: where the k come from, ``sim`` (the sim head) or
    ``encoder`` (the encoder's own cosine; see :meth:`Embeddings.retrieval`).
    Returns (metrics, hits): ``top1`` (reranked; ties count against the true counter), ``retrieval_top1``
    (nearest neighbour), ``recall_at_k`` (true counter among the k), ``mrr`` (reciprocal rank of the true
    counter after reranking the k; 0 when it is not among them), ``queries``, ``k``; ``hits`` [Q] bool is the
    reranked top-1 outcome per query.
    """
    pairs = np.arange(split.n_pairs) if pairs is None else np.asarray(pairs)
    rows, _ = retrieve(emb.retrieval(space).numpy(), split, k, index, device, pairs)
    n_q, k_eff = rows.shape
    queries = np.repeat(split.query[pairs], k_eff)
    margins = pair_margins(model, emb, queries, rows.ravel(), batch_size, device).reshape(n_q, k_eff)
    is_true = rows == split.counter[pairs][:, None]
    in_k = is_true.any(axis=1)
    true_margin = np.where(in_k, (margins * is_true).sum(axis=1), -np.inf)
    # rank 1 only if every other retrieved candidate scores strictly lower (by logit margin, see pair_margins)
    rank = 1 + ((margins >= true_margin[:, None]) & ~is_true).sum(axis=1)
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


def run_evaluation(cfg: DictConfig, out_dir: Path) -> dict:
    """The 8 tasks on ``eval.split`` with ``eval.score``; writes JSON to ``eval.output`` (default in out_dir)."""
    start = time.time()
    validate(cfg)
    score = cfg.eval.score
    try:
        split_name = canonical_split(str(cfg.eval.split))
    except CorpusError:
        raise ConfigError(f"eval.split={cfg.eval.split!r} is not valid: use val or test (or train; the folder "
                          "names validation/training work too)") from None
    if cfg.eval.checkpoint is None and score in NEEDS_TRAINED:
        raise ConfigError(f"eval.score={score} needs trained weights: pass eval.checkpoint=<run folder or best.pt>, "
                          "or use eval.score=encoder_cosine (zero-shot) or eval.score=tfidf")
    corpus = read_corpus(cfg.data.root).used(cfg.data.dedup)
    split = corpus.paired(split_name, cfg.data.max_debates)
    retrieve = cfg.eval.retrieve  # None: the checkpoint's own
    groups = None
    if split_name == "test":  # unseen / seen: does a query's text occur in the train/val pairs a run would use?
        seen = seen_queries(split, [corpus.paired(s, cfg.data.max_debates) for s in ("train", "val")])
        groups = {"unseen": ~seen, "seen": seen}
    # one process, whatever the environment says (never under torchrun)
    runtime = decide(cfg.trainer.device, cfg.trainer.precision, cfg.trainer.deterministic, environ={})
    runtime.apply()
    device = runtime.device
    set_seed_everywhere(cfg.seed)
    model = emb = None
    model_cfg = OmegaConf.to_container(cfg.model, resolve=True)
    if score != "tfidf":
        if cfg.eval.checkpoint is not None:
            model, tokenizer, model_cfg, trained = load_checkpoint(cfg.eval.checkpoint, progress=show_progress(cfg))
            retrieve = retrieve or trained["retrieve"]
        else:
            model, tokenizer = build_model(cfg.model, progress=show_progress(cfg))
        model.to(device)
        kwargs = dict(batch_size=cfg.trainer.eval_batch_size, device=device, progress=show_progress(cfg),
                      autocast_dtype=runtime.autocast_dtype, desc=f"encode {split_name}")
        if model_cfg["encoder"].get("freeze"):  # a frozen encoder's outputs come from (and go to) the cache
            pooled = cached_pooled(model, tokenizer, split.texts, model_cfg["max_length"], cfg.trainer.cache_dir,
                                   encoder_fingerprint(model.encoder), **kwargs)
        else:
            pooled = encode_pooled(model, TokenizedTexts(split.texts, tokenizer, model_cfg["max_length"]), **kwargs)
        emb = embed_pooled(model, pooled, cfg.eval.pair_batch_size, device)
    tasks = evaluate_tasks(split, score, model=model, emb=emb, k=cfg.eval.k, device=device,
                           batch_size=cfg.eval.pair_batch_size, groups=groups, retrieve=retrieve or "sim")
    result = {
        "score": score,
        "retrieve": (retrieve or "sim") if score == "rerank" else None,
        "split": split_name,
        "data": cfg.data.name,
        "dedup": bool(cfg.data.dedup),
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


register()


@hydra.main(version_base="1.3", config_path=conf_dir(), config_name="evaluate")
def main(cfg: DictConfig) -> None:
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        run_evaluation(cfg, out_dir)
    except BiencoderError as err:
        fail(err, out_dir)


def cli() -> None:
    """The ``biencoder-evaluate`` command (Hydra tab completion: ``eval "$(biencoder-evaluate -sc install=bash)"``)."""
    hydra_cli(main)


if __name__ == "__main__":
    cli()
