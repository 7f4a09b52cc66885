"""What one run computes from, made once per run: the pairs it uses and what is known of them (:class:`RunData`:
the splits, the test queries seen in training or validation, the deduplication's record, the pair files'
provenance), and what the encoder takes of each split (:class:`EncoderInputs`: a frozen encoder's pooled vectors,
from the embedding cache, or a trained encoder's token ids, from the token cache).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from ..config.schema import DataSchema
from ..data.corpus import run_splits, seen_queries
from ..data.judged import JUDGED_POOL_TEXT, JudgedSplit
from ..data.paired import POOL_TEXT, PairedSplit
from ..machine import distributed
from ..modeling.cache import encoder_fingerprint
from ..modeling.encoding import TextEncoder, TokenizedTexts, pooled_vectors
from ..modeling.token_cache import TokenCache
from .triplets import TrainingInputs

log = logging.getLogger("biencoder")

#: the unpaired arguments a run's log names (the rest are counted)
UNPAIRED_SHOWN = 5


@dataclass(frozen=True)
class RunData:
    """The pairs a run uses (:func:`~biencoder.engine.data.corpus.run_splits`), read once.

    Attributes:
        splits: split name → :class:`PairedSplit` (train, val, test).
        test_seen: [Q] bool, the test queries whose point or counter text occurs in a training or validation pair.
        overlap: ``final.json``'s ``overlap``: dedup on or off, the pairs it dropped, test queries seen and unseen.
        files: pair files: where the data came from (path, size, sha256 per file); empty for ArguAna.
        counts: per split, the pairs that repeat an earlier anchor and positive, and those with given negatives.
        pool: the per-epoch pool (``data.pool``), as the log names it.
        unpaired: ArguAna's arguments left out for want of their other half (:attr:`Corpus.unpaired`).
    """

    splits: dict[str, PairedSplit]
    test_seen: np.ndarray
    overlap: dict
    files: dict
    counts: dict
    pool: str
    unpaired: tuple[str, ...] = ()

    @classmethod
    def read(cls, data: DataSchema) -> RunData:
        """The run's pairs from the ``data`` config group (either reader, ``data.layout``)."""
        corpus, splits = run_splits(data)
        test_seen = seen_queries(splits["test"], [splits["train"], splits["val"]])
        overlap = {
            "dedup": bool(data.dedup),
            "dropped_pairs": dict(corpus.dropped),
            "test_queries_seen": int(test_seen.sum()),
            "test_queries_unseen": int((~test_seen).sum()),
        }
        files, unpaired = getattr(corpus, "files", {}), getattr(corpus, "unpaired", ())
        return cls(splits, test_seen, overlap, files, corpus.counts, str(data.pool), unpaired)

    def log(self, eval_pairs: dict[str, np.ndarray | None]) -> None:
        """Log what a person reading ``train.log`` needs to know of the data: the deduplication, the per-epoch samples
        of queries (``eval_pairs``: per split, the queries evaluated each epoch, None for all), and the pair files
        with their repeated pairs and given negatives."""
        if self.overlap["dedup"]:
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
        if self.unpaired:
            more = ", ..." if len(self.unpaired) > UNPAIRED_SHOWN else ""
            shown = ", ".join(self.unpaired[:UNPAIRED_SHOWN]) + more
            log.warning(
                "data: %d argument(s) left out, their other half missing (biencoder-corpus stats counts them): %s",
                len(self.unpaired),
                shown,
            )
        for name, pairs in eval_pairs.items():
            if pairs is not None:
                log.info(
                    "per-epoch %s metrics on a fixed sample of %d of its %d queries (eval.%s_queries)",
                    name,
                    len(pairs),
                    self.splits[name].n_pairs,
                    name,
                )
        for role, f in self.files.items():
            log.info("data.%s: %s (%d bytes, sha256 %s)", role, f["path"], f["bytes"], f["sha256"])
        self._log_what_was_read()

    def _log_what_was_read(self) -> None:
        """A BEIR folder's judgements, or pair files' repeated pairs and given negatives, with the per-epoch pool."""
        if isinstance(self.splits["test"], JudgedSplit):
            log.info(
                "BEIR judgements per split (queries, judgements, queries with several relevant documents, graded) "
                "%s; training pairs: each query with each relevant document; per-epoch pool (data.pool=%s): %s",
                {
                    n: (c["queries"], c["judgements"], c["multi_relevant_queries"], c["graded_judgements"])
                    for n, c in self.counts.items()
                },
                self.pool,
                JUDGED_POOL_TEXT[self.pool],
            )
        elif self.files:
            log.info(
                "pairs that repeat an earlier anchor and positive (each is its own query) %s; given negatives "
                "%s; per-epoch pool (data.pool=%s): %s",
                {n: c["duplicated_pairs"] for n, c in self.counts.items()},
                {n: c["with_negative"] for n, c in self.counts.items()},
                self.pool,
                POOL_TEXT[self.pool],
            )


def tokenizing(encoder: TextEncoder) -> Callable[[list[str], str], tuple[TokenizedTexts, bool]]:
    """How a run tokenises texts: ``(texts, desc)`` → (:class:`TokenizedTexts` by ``encoder``'s tokenizer and
    ``max_length``, whether they came from the cache). Through the token cache under ``encoder.cache_dir``
    (:class:`~biencoder.engine.modeling.token_cache.TokenCache`, one log line per call), or tokenised without one
    when it is None."""
    if encoder.cache_dir is None:
        return lambda texts, desc: (TokenizedTexts(texts, encoder.tokenizer, encoder.max_length), False)
    return TokenCache(encoder.cache_dir, encoder.tokenizer, encoder.max_length).tokenized


@dataclass
class EncoderInputs:
    """What the encoder takes of each split, made once per run (:meth:`make`): a frozen encoder's pooled vectors per
    split (``pooled``, on the device: training batches are gathered from them every epoch) with its ``fingerprint``,
    or a trained encoder's token ids per split (``tokens``; ``fingerprint`` None) and, per split, whether they were
    read from the token cache (``tokens_cached``). Each holds the split's table rows; the training split's given
    negatives go to the trainer only (:meth:`training_inputs`)."""

    fingerprint: str | None
    pooled: dict[str, torch.Tensor]
    tokens: dict[str, TokenizedTexts]
    tokens_cached: dict[str, bool] = field(default_factory=dict)

    @property
    def frozen(self) -> bool:
        return self.fingerprint is not None

    @classmethod
    def make(cls, encoder: TextEncoder, splits: dict[str, PairedSplit], frozen: bool) -> EncoderInputs:
        """A trained encoder's texts tokenised once per corpus (:func:`tokenizing`: read from the token cache under
        ``encoder.cache_dir`` when a run before tokenised them alike); a frozen encoder's pooled vectors computed once
        by ``encoder`` (or read from its cache; rank 0 fills the cache first), its weights set not to train."""
        if not frozen:
            tokenize = tokenizing(encoder)
            made = {name: tokenize(s.texts, f"tokens {name}") for name, s in splits.items()}
            return cls(None, {}, {n: t for n, (t, _) in made.items()}, {n: c for n, (_, c) in made.items()})
        encoder.model.encoder.requires_grad_(False)
        encoder = replace(encoder, fingerprint=encoder_fingerprint(encoder.model.encoder))
        main = distributed.is_main()
        if not main:
            distributed.barrier()  # rank 0 fills the cache first, the others read it
        # the training split's given negatives (pair files) are encoded with it: rows 2Q + j of the trainer's vectors
        pooled = {
            name: pooled_vectors(encoder, s.texts + (s.extra_texts if name == "train" else []), f"encode {name}").to(
                encoder.encoding.device
            )
            for name, s in splits.items()
        }
        if main:
            distributed.barrier()
        return cls(encoder.fingerprint, pooled, {})

    def training_inputs(self, train: PairedSplit, encoder: TextEncoder) -> TrainingInputs:
        """What the trainer gathers its triplets from: the training split's rows, then its given negatives
        (:attr:`PairedSplit.extra_texts`, tokenised as :func:`tokenizing` says for a trained encoder); :attr:`pooled`
        is cut to the split's rows here."""
        if self.frozen:
            pooled, self.pooled["train"] = self.pooled["train"], self.pooled["train"][: len(train.texts)]
            return TrainingInputs(train, pooled=pooled)
        if not train.extra_texts:
            return TrainingInputs(train, tokens=self.tokens["train"])
        tokens, _ = tokenizing(encoder)(train.texts + train.extra_texts, "tokens train with its given negatives")
        return TrainingInputs(train, tokens=tokens)
