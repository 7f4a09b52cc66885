"""The ``python -m biencoder.evaluate`` app: the 8 official tasks on one split (:mod:`biencoder.engine.retrieval.official_tasks`), for a
checkpoint or a baseline."""

from __future__ import annotations

import logging
import resource
import time
from dataclasses import replace
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from .engine.config.validation import validate
from .engine.data.arguana import CorpusError
from .engine.data.corpus import PairedSplit, read_corpus, seen_queries
from .engine.data.corpus import split_name as canonical_split
from .engine.files import write_json_atomic
from .engine.machine.runtime import Runtime, decide, set_seed_everywhere, show_progress
from .engine.modeling.encoding import Encoding, TextEncoder, embed_pooled, pooled_vectors
from .engine.modeling.model import BiModel, Embeddings, build_model
from .engine.retrieval.official_tasks import evaluate_tasks
from .engine.retrieval.rerank import Rerank, query_groups
from .engine.runs.checkpoint import load_checkpoint
from .errors import BiencoderError, ConfigError
from .hydra_glue import conf_dir, fail, hydra_cli, register
from .report.run import format_tasks

log = logging.getLogger("biencoder")


# -- python -m biencoder.evaluate ---------------------------------------------------------------------------------
NEEDS_TRAINED = ("rerank", "classifier", "sim")


def run_evaluation(cfg: DictConfig, out_dir: Path) -> dict:
    """The 8 tasks on ``eval.split`` with ``eval.score``; writes JSON to ``eval.output`` (default in out_dir)."""
    start = time.time()
    split_name, score = _checked(cfg)
    corpus = read_corpus(cfg.data.root).used(cfg.data.dedup)
    split = corpus.paired(split_name, cfg.data.max_debates)
    retrieve = cfg.eval.retrieve  # None: the checkpoint's own
    groups = None
    if split_name == "test":  # unseen / seen: does a query's text occur in the train/val pairs a run would use?
        seen = seen_queries(split, [corpus.paired(s, cfg.data.max_debates) for s in ("train", "val")])
        groups = query_groups(seen)
    # one process, whatever the environment says (never under torchrun)
    runtime = decide(cfg.trainer.device, cfg.trainer.precision, cfg.trainer.deterministic, environ={})
    runtime.apply()
    set_seed_everywhere(cfg.seed)
    model = emb = model_cfg = None  # TF-IDF needs no model
    if score != "tfidf":
        model, emb, model_cfg, trained = _embedded(cfg, split, runtime)
        retrieve = retrieve or trained
    rerank = replace(Rerank.of_run(cfg.eval, runtime), space=retrieve or "sim")
    tasks = evaluate_tasks(split, score, model, emb, rerank, groups)
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
    log.info(
        "8 tasks on %s, score=%s (%.1f s, peak RSS %.0f MB)\n%s\nwritten to %s",
        split_name,
        score,
        result["wall_time_s"],
        result["peak_rss_mb"],
        format_tasks({split_name: tasks}),
        output,
    )
    return result


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
        split_name = canonical_split(str(cfg.eval.split))
    except CorpusError:
        raise ConfigError(
            f"eval.split={cfg.eval.split!r} is not valid: use val or test (or train; the folder "
            "names validation/training work too)"
        ) from None
    if cfg.data.layout != "arguana":
        raise ConfigError(
            f"data={cfg.data.name}: biencoder-evaluate runs the 8 official tasks, which need ArguAna's "
            "debates, sides and themes (data=arguana or data=demo); a run on pair files has its top-1 "
            "and baselines in its final.json"
        )
    if cfg.eval.checkpoint is None and cfg.eval.score in NEEDS_TRAINED:
        raise ConfigError(
            f"eval.score={cfg.eval.score} needs trained weights: pass eval.checkpoint=<run folder or "
            "best.pt>, or use eval.score=encoder_cosine (zero-shot) or eval.score=tfidf"
        )
    return split_name, cfg.eval.score


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
