"""What a run is scored by: each epoch the retrieve-k-then-rerank top-1 of every split
(:meth:`Evaluation.evaluate_split`: the ranks of :mod:`biencoder.engine.retrieval.rerank`, the numbers of
:mod:`biencoder.engine.retrieval.metrics`; the within-group top-1 of pair files with groups), and at the end the 8
official tasks with the best-by-val weights (:meth:`Evaluation.tasks`), the zero-shot and TF-IDF baselines on the
same queries (:meth:`Evaluation.baselines`) and the best epoch's test ranking as TREC files
(:meth:`Evaluation.trec_files`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

import numpy as np
import torch

from ..machine import distributed
from ..modeling.encoding import Encoding, embed_pooled, encode, encode_pooled
from ..modeling.model import BiModel, Embeddings
from ..retrieval.groups import group_rerank
from ..retrieval.metrics import Ranks, epoch_metrics, group_top1, query_groups, top1, top1_hits
from ..retrieval.official_tasks import baseline_ranks, evaluate_tasks
from ..retrieval.order import Retrieval, retrieval_order
from ..retrieval.rerank import NonFiniteMargins, Rerank, final_ranking, query_sample, rerank_ranks
from ..runs.best import BestEpoch
from ..runs.trec import ranking_files
from .epoch import Diverged
from .inputs import EncoderInputs, RunData
from .settings import EvalSettings

SPLITS = ("train", "val", "test")
#: final.json's ``tasks_skipped`` and the summary's line when the data cannot have the 8 official tasks
NO_TASKS = (
    "no 8-task table: the official tasks type candidates by ArguAna's debates, sides and themes, which pair "
    "files do not have; the per-epoch top-1 (and top1_group where the files have groups) is this data's result"
)

log = logging.getLogger("biencoder")


class Evaluation:
    """Scores one run's ``model`` on its splits, per epoch and at the end.

    Args:
        settings: what the run is scored by (:class:`EvalSettings`: the config's ``eval``, read once).
        data: the run's pairs; ``inputs``: what the encoder takes of each split.
        encoding: how a trained encoder's texts are encoded; ``rerank``: how a split is retrieved and reranked
            (``eval.*``), its batches also the sim head's.
    """

    def __init__(
        self,
        settings: EvalSettings,
        model: BiModel,
        data: RunData,
        inputs: EncoderInputs,
        encoding: Encoding,
        rerank: Rerank,
    ):
        self.settings, self.model, self.data, self.inputs = settings, model, data, inputs
        self.encoding, self.rerank = encoding, rerank
        self.metric = settings.selection["metric"]  # the hits are this metric's
        self.pairs = self._pairs()
        self.orders: dict[str, Retrieval] = {}  # fixed_order, per split
        self.zero_shot = self._zero_shot()

    def _pairs(self) -> dict[str, np.ndarray | None]:
        """The queries evaluated per epoch, per split: all (None), or a fixed sample of ``eval.<split>_queries``
        (:func:`rerank.query_sample`: the same for every seed and cell, so curves stay comparable). Mining always uses
        every training pair, the pools stay whole splits, and the 8 tasks at the end score every query."""
        splits, wanted = self.data.splits, self.settings.queries
        return {name: query_sample(splits[name].n_pairs, wanted[name]) for name in SPLITS}

    @property
    def seen(self) -> np.ndarray:
        """[P] bool: :attr:`RunData.test_seen` of the test queries evaluated per epoch (all, or ``eval.test_queries``):
        what the per-epoch test numbers, ``test_hits.npy`` and the baselines are split into unseen and seen by."""
        pairs = self.pairs["test"]
        return self.data.test_seen if pairs is None else self.data.test_seen[pairs]

    def _zero_shot(self) -> dict[str, torch.Tensor] | None:
        """The untrained encoder's pooled val/test vectors, for the zero-shot baseline in the summary (rank 0, when
        ``eval.baselines`` asks for it: ``auto`` = when cheap)."""
        want, splits = self.settings.baselines, self.data.splits
        cheap = self.inputs.frozen or sum(len(splits[n].texts) for n in ("val", "test")) <= 2000
        if not distributed.is_main() or not (want is True or (want == "auto" and cheap)):
            return None
        quiet = replace(self.encoding, progress=False)
        return {
            n: self.inputs.pooled[n].cpu()
            if self.inputs.frozen
            else encode_pooled(self.model, self.inputs.tokens[n], quiet, f"encode {n} (zero-shot)")
            for n in ("val", "test")
        }

    # -- per epoch ----------------------------------------------------------------------------------------------
    def embed(self, name: str) -> Embeddings:
        """The :class:`Embeddings` of split ``name``'s rows with the model's current weights."""
        if self.inputs.frozen:
            return embed_pooled(self.model, self.inputs.pooled[name], self.rerank.batch_size, self.rerank.device)
        return encode(self.model, self.inputs.tokens[name], self.encoding, f"encode {name}")

    def evaluate_split(self, name: str, emb: Embeddings, epoch: int = -1) -> tuple[dict, np.ndarray]:
        """(metrics, per-query hits) of the per-epoch retrieve-and-rerank on split ``name`` with embeddings ``emb``:
        :func:`~biencoder.engine.retrieval.metrics.epoch_metrics`, then on test the top-1 of the unseen and the seen
        queries with their counts; the hits [Q] bool are the top-1 outcome of the selection metric (:attr:`metric`):
        reranked (the final ranking's), or the nearest neighbour. Raises :class:`Diverged` for non-finite embeddings
        or margins."""
        # a frozen encoder's pooled vectors were checked finite once, when pooled_vectors returned them
        if not (torch.isfinite(emb.sim).all() and (self.inputs.frozen or torch.isfinite(emb.pooled).all())):
            raise Diverged(epoch, f"{name} embeddings")
        split, pairs, rerank = self.data.splits[name], self.pairs[name], self.rerank
        order = self.fixed_order(name, emb)
        seen = self.seen if name == "test" else None
        try:
            ranks = rerank_ranks(self.model, emb, split, rerank, pairs, order)
            metrics = epoch_metrics(ranks.reranked, ranks.retrieved, ranks.final)
            if split.groups is not None:  # pair files with a group column: the within-group top-1 too
                metrics.update(group_rerank(self.model, emb, split, rerank, pairs, seen)[0])
        except NonFiniteMargins as err:  # never ranked: a NaN would count as a hit
            raise Diverged(epoch, f"{name} classifier margins ({err.count} of {err.total})") from err
        if seen is not None:
            metrics.update(group_top1(ranks.reranked, query_groups(seen), counts=True))
        # the top-1 outcome of the ranking the selection metric reads: the retrieval order's, else the reranked one's
        # (the final ranking's first place is the reranked shortlist's)
        return metrics, top1_hits(ranks.retrieved if self.metric == "retrieval_top1" else ranks.reranked)

    def fixed_order(self, name: str, emb: Embeddings) -> Retrieval | None:
        """The per-epoch retrieval order of split ``name`` (:func:`retrieval_order`, whose first k places are the
        shortlists) when it cannot change: a frozen encoder's own space (``eval.retrieve=encoder``) is the same every
        epoch, so it is searched once per run; else None."""
        if not (self.inputs.frozen and self.rerank.space == "encoder"):
            return None
        if name not in self.orders:
            rerank = self.rerank
            self.orders[name] = retrieval_order(
                emb.retrieval("encoder").numpy(),
                self.data.splits[name],
                rerank.k,
                rerank.index,
                rerank.device,
                self.pairs[name],
            )
        return self.orders[name]

    # -- at the end -------------------------------------------------------------------------------------------
    def final_scores(self, best: BestEpoch) -> dict:
        """What ``final.json`` holds of the end's scores, with the (loaded) best-by-val weights: ``tasks`` (or
        ``tasks_skipped`` when the data cannot have them) when ``eval.tasks``, ``baselines`` when computed."""
        scores = {}
        if self.settings.tasks and self.data.splits["val"].supports_tasks:
            scores["tasks"] = self.tasks(best)
        elif self.settings.tasks:
            scores["tasks_skipped"] = NO_TASKS
        if self.zero_shot is not None:
            scores["baselines"] = self.baselines()
        return scores

    def trec_files(self, best: BestEpoch, tag: str) -> dict[str, str]:
        """``test.run.gz`` and ``test.qrels`` (name → content, :mod:`biencoder.engine.runs.trec`) of the best epoch's
        final test ranking (:func:`final_ranking`, with the loaded best-by-val weights and that epoch's test
        embeddings, or the same computed again after a resume), the run named ``tag``."""
        split, pairs = self.data.splits["test"], self.pairs["test"]
        emb = best.embs["test"] if "test" in best.embs else self.embed("test")
        return ranking_files(split, pairs, final_ranking(self.model, emb, split, self.rerank, pairs), tag)

    def tasks(self, best: BestEpoch) -> dict:
        """The 8 official tasks on val and test with the (loaded) best-by-val weights, with ``eval.score``."""
        score, embs = self.settings.score, best.embs
        tasks = {"score": score}
        began = time.monotonic()
        log.info("8 tasks on val and test with the weights of epoch %d (eval.score=%s)", best.epoch, score)
        for name in ("val", "test"):
            emb = embs[name] if name in embs else self.embed(name)
            groups = query_groups(self.data.test_seen) if name == "test" else None
            tasks[name] = evaluate_tasks(self.data.splits[name], score, self.model, emb, self.rerank, groups)
        log.info("8 tasks done in %.1f s", time.monotonic() - began)
        return tasks

    def baselines(self) -> dict:
        """Top-1 of the zero-shot encoder's cosine and of TF-IDF on val and test (:func:`tasks.baseline_ranks`): the
        same queries (``eval.val_queries`` / ``eval.test_queries``) and pools as the per-epoch top-1 (the epa task),
        with the unseen/seen split on test."""
        out = {}
        for name in ("val", "test"):
            groups = query_groups(self.seen) if name == "test" else {}
            out[name] = {}
            ranks = baseline_ranks(self.data.splits[name], self.zero_shot[name], self.pairs[name])
            for score, rank in ranks.items():
                every = Ranks(rank)
                out[name][score] = {"top1": top1(every), "queries": len(every), **group_top1(every, groups)}
        return out
