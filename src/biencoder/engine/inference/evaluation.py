"""The 8 official tasks (:mod:`biencoder.engine.retrieval.official_tasks`) on one split, or the MTEB protocol
(:mod:`biencoder.engine.retrieval.mteb`, ``eval.protocol=mteb``) on its points, for a checkpoint or an untrained
baseline: :func:`run_evaluation`, which ``python -m biencoder.evaluate`` runs (its Hydra shell).

It takes the steps a run takes, in a run's order: the corpus and paired splits a run on the config reads
(:func:`~biencoder.engine.data.corpus.run_splits`), the test queries such a run has seen
(:func:`~biencoder.engine.data.paired.seen_queries`), the runtime decision, then the seed; then the checkpoint (or
the untrained encoder) embeds the split through the embedding cache where its encoder is untrained or frozen.
"""

from __future__ import annotations

import resource
import time
from dataclasses import replace
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from ...errors import ConfigError
from ..config.validation import validate
from ..data.arguana import CorpusError
from ..data.corpus import PairedSplit, read_corpus, run_splits, seen_queries, split_name
from ..files import write_json_atomic
from ..machine.runtime import Runtime, decide, set_seed_everywhere, show_progress
from ..modeling.encoding import Encoding, TextEncoder, embed_pooled, pooled_vectors
from ..modeling.model import BiModel, Embeddings, build_model
from ..retrieval.metrics import query_groups
from ..retrieval.mteb import CorpusQueries, corpus_queries, protocol_metrics, protocol_ranks
from ..retrieval.official_tasks import evaluate_tasks
from ..retrieval.rerank import Rerank
from ..runs.checkpoint import load_checkpoint

#: the ``eval.score`` values that score with trained heads: they need ``eval.checkpoint``
NEEDS_TRAINED = ("rerank", "classifier", "sim")


def run_evaluation(cfg: DictConfig, out_dir: Path) -> dict:
    """The 8 tasks on ``eval.split`` with ``eval.score`` (or, with ``eval.protocol=mteb``, the MTEB protocol on its
    points), for ``eval.checkpoint`` (or the untrained ``model`` config without one); the record is written as JSON
    to :func:`evaluation_output` and returned: ``tasks`` (:func:`evaluate_tasks`), or ``mteb``
    (:func:`_protocol_record`). Raises :class:`ConfigError` for a config this evaluation cannot run, before any
    work."""
    start = time.time()
    name, score = _checked(cfg)
    if cfg.eval.protocol == "mteb":  # the candidates are every text of the corpus on disk, whatever data.dedup says
        split, groups = corpus_queries(read_corpus(cfg.data.root), name, cfg.data.max_debates), None
    else:
        split, groups = _evaluated_split(cfg, name)
    # one process, whatever the environment says (never under torchrun)
    runtime = decide(cfg.trainer.device, cfg.trainer.precision, cfg.trainer.deterministic, environ={})
    runtime.apply()
    set_seed_everywhere(cfg.seed)
    measured, retrieve, model_cfg = _scored(cfg, split, groups, runtime)
    result = {
        "protocol": cfg.eval.protocol,
        "score": score,
        "retrieve": retrieve if score == "rerank" else None,
        "split": name,
        "data": cfg.data.name,
        "dedup": bool(cfg.data.dedup),
        "checkpoint": None if cfg.eval.checkpoint is None else str(cfg.eval.checkpoint),
        "encoder": None if score == "tfidf" else model_cfg["encoder"]["name_or_path"],
        "pooling": None if score == "tfidf" else model_cfg["pooling"],
        **measured,
        "wall_time_s": round(time.time() - start, 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    output = evaluation_output(cfg, out_dir)
    output.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(output, result)
    return result


def _scored(
    cfg: DictConfig, split: PairedSplit | CorpusQueries, groups: dict | None, runtime: Runtime
) -> tuple[dict, str, dict | None]:
    """(``{"tasks": the 8 tasks of split}`` with ``eval.score``, or ``{"mteb": the protocol's record}`` for
    :class:`CorpusQueries`; the space ``rerank`` retrieved in; the model config or None for TF-IDF). The space:
    ``eval.retrieve``, else the space the checkpoint was selected with, else ``sim``."""
    score, retrieve = cfg.eval.score, cfg.eval.retrieve  # retrieve None: the checkpoint's own
    model = emb = model_cfg = None  # TF-IDF needs no model
    if score != "tfidf":
        model, emb, model_cfg, trained = _embedded(cfg, split, runtime)
        retrieve = retrieve or trained
    rerank = replace(Rerank.of_run(cfg.eval, runtime), space=retrieve or "sim")
    if isinstance(split, CorpusQueries):
        measured = {"mteb": _protocol_record(split, protocol_ranks(split, score, model, emb, rerank))}
    else:
        measured = {"tasks": evaluate_tasks(split, score, model, emb, rerank, groups)}
    return measured, retrieve or "sim", model_cfg


def _protocol_record(queries: CorpusQueries, ranks) -> dict:
    """The ``mteb`` entry of an evaluation record: :func:`protocol_metrics` of the ranks, ``candidates`` (distinct
    texts of the corpus; each query has one fewer, its own), and ``ranks``: the rank of each query's counter, in the
    order of the split's pairs (by pair id, as every run's test_hits.npy), what a bootstrap over queries resamples.
    The pair ids are not written: they are the corpus's folder names."""
    return {**protocol_metrics(ranks), "candidates": len(queries.table), "ranks": ranks.rank.tolist()}


def evaluation_output(cfg: DictConfig, out_dir: Path) -> Path:
    """Where :func:`run_evaluation` writes its record: ``eval.output``, else ``<out_dir>/eval.json``."""
    return Path(cfg.eval.output) if cfg.eval.output else out_dir / "eval.json"


def _checked(cfg: DictConfig) -> tuple[str, str]:
    """(the split's canonical name, ``eval.score``) once the config is valid for an evaluation; else
    :class:`ConfigError`, before any work."""
    validate(cfg)
    if cfg.eval.output and Path(cfg.eval.output).is_dir():  # found now, not after the evaluation
        raise ConfigError(
            f"eval.output={cfg.eval.output} is a folder: name the JSON file to write, e.g. "
            f"eval.output={Path(cfg.eval.output) / 'eval.json'}"
        )
    try:
        name = split_name(str(cfg.eval.split))
    except CorpusError:
        raise ConfigError(
            f"eval.split={cfg.eval.split!r} is not valid: use val or test (or train; the folder "
            "names validation/training work too)"
        ) from None
    if cfg.data.layout != "arguana":
        raise ConfigError(
            f"data={cfg.data.name}: biencoder-evaluate runs the 8 official tasks or the MTEB protocol, which need "
            "ArguAna's debates, sides and themes (data=arguana or data=demo); a run on pair files has its top-1 "
            "and baselines in its final.json"
        )
    if cfg.eval.checkpoint is None and cfg.eval.score in NEEDS_TRAINED:
        raise ConfigError(
            f"eval.score={cfg.eval.score} needs trained weights: pass eval.checkpoint=<run folder or "
            "best.pt>, or use eval.score=encoder_cosine (zero-shot) or eval.score=tfidf"
        )
    return name, cfg.eval.score


def _evaluated_split(cfg: DictConfig, name: str) -> tuple[PairedSplit, dict | None]:
    """(split ``name`` of the paired splits a run on ``cfg`` reads, the test queries' unseen / seen groups or None).

    The split's candidate pool is ``all`` whatever ``data.pool`` says: the 8 tasks of this command are scored on the
    whole split. Test queries are grouped by whether their point or counter text occurs in the train/val pairs such a
    run uses."""
    _, splits = run_splits(cfg.data)
    split = replace(splits[name], pool="all")
    if name != "test":
        return split, None
    return split, query_groups(seen_queries(split, [splits["train"], splits["val"]]))


def _embedded(cfg: DictConfig, split: PairedSplit, runtime: Runtime) -> tuple[BiModel, Embeddings, dict, str | None]:
    """(model, :class:`Embeddings` of every row of ``split``, model config, the retrieval space the checkpoint was
    selected with or None) for ``eval.checkpoint``, or for the untrained ``model`` config without one."""
    trained, progress = None, show_progress(cfg)
    if cfg.eval.checkpoint is not None:
        model, tokenizer, model_cfg, settings = load_checkpoint(cfg.eval.checkpoint, progress=progress)
        trained = settings["retrieve"]
    else:
        model, tokenizer = build_model(cfg.model, progress=progress)
        model_cfg = OmegaConf.to_container(cfg.model, resolve=True)
    model.to(runtime.device)
    # an untrained encoder's outputs (no checkpoint: zero-shot) and a frozen one's come from (and go to) the cache,
    # which the frozen runs share; a fine-tuned encoder's would be used by this checkpoint alone
    untrained = cfg.eval.checkpoint is None or model_cfg["encoder"].get("freeze")
    cache_dir = cfg.trainer.cache_dir if untrained else None
    encoding = Encoding.of_run(cfg.trainer, runtime, progress)
    encoder = TextEncoder(model, tokenizer, model_cfg["max_length"], encoding, cache_dir)
    pooled = pooled_vectors(encoder, split.texts, f"encode {split.name}")
    emb = embed_pooled(model, pooled, runtime.pair_batch_size(cfg.eval.pair_batch_size), runtime.device)
    return model, emb, model_cfg, trained
