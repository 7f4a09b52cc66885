"""Item 8 (CUDA): a peer for our training throughput, sentence-transformers' own trainer on the same triplets.

all-MiniLM-L6-v2 (``model=minilm``'s packaged encoder) trained by ``SentenceTransformerTrainer`` with
``MultipleNegativesRankingLoss`` on ``data=arguana``'s epoch-0 (point, counter, mined negative) triplets in our
trainer's order (:func:`epoch_triplets`), 16 triplets x 128 tokens, bf16, beside our runner's own epoch on them
(:func:`ours_triplets_s`) and the ratio. Where the trainer cannot run (the GPU image may lack ``datasets``), the
same model and loss run in a plain loop, and the line says so. sentence-transformers is imported only inside."""

from __future__ import annotations

import argparse
import gc
import shutil
import tempfile
from pathlib import Path

import torch

from biencoder.bench.common import Devices, compose_config, corpus_found, timed
from biencoder.bench.st_peer import PeerResult, bench_sentence_transformers, one_line
from biencoder.engine.training.runner import Runner
from biencoder.engine.training.triplets import triplet_rows

#: the run whose epoch-0 triplets the peer trains on: the default fine-tuning run of item 6
TRIPLET_OVERRIDES = ["data=arguana", "+variant=ln_relu", "trainer.progress=false", "eval.tasks=false"]
HEADLINE = "peer_sentence_transformers_triplets_s"


# -- the triplets ---------------------------------------------------------------------------------------------------
def epoch_triplets(runner: Runner, epoch: int = 0) -> list[tuple[str, str, str]]:
    """(point, counter, negative) texts of ``runner``'s training epoch ``epoch``, in the order its trainer takes them:
    negatives mined from the training split's embeddings under the current weights (:meth:`EpochTrainer.mine`; what
    the runner's first epoch mines from with ``model.sim_init=random``, the default), rows from :func:`triplet_rows`
    through :meth:`EpochTrainer.batches` (its seeded shuffle). The mining and shuffling random streams are put back as
    they were, so the runner's own epoch ``epoch`` trains on the same triplets."""
    trainer = runner.trainer
    mining, order = trainer.rng.bit_generator.state, trainer.loader_generator.get_state()
    try:
        negatives = trainer.mine(epoch, runner.evaluation.embed("train").sim)
        rows = [row for batch, _ in trainer.batches(epoch, negatives) for row in batch]
    finally:
        trainer.rng.bit_generator.state = mining
        trainer.loader_generator.set_state(order)
    assert len(rows) == len(triplet_rows(trainer.split, negatives))  # every row once
    texts = trainer.split.texts + trainer.split.extra_texts  # rows 2Q + j are the given negatives
    return [(texts[p], texts[c], texts[n]) for p, c, n in rows]


def ours_triplets_s(runner: Runner) -> float:
    """Our triplets/s on :func:`epoch_triplets`' triplets (call it first): the runner's own epoch 0 (mining, its
    loader, the pair classifier, on CUDA its graphs) once to warm up, then again on the same negatives, timed."""
    trainer = runner.trainer
    negatives = trainer.mine(0, runner.evaluation.embed("train").sim)
    trainer.train_epoch(0, negatives)
    seconds, _ = timed(lambda: trainer.train_epoch(0, negatives), sync=runner.device)
    return trainer.n_triplets / seconds


def ours_and_triplets(cfg) -> tuple[float, list[tuple[str, str, str]]]:
    """(:func:`ours_triplets_s`, :func:`epoch_triplets`) of epoch 0 of the run ``cfg`` composes, by a
    :class:`Runner` in a temporary folder, dropped before returning (its device memory freed for the peer)."""
    out = Path(tempfile.mkdtemp(prefix="bench-peer-"))
    try:
        runner = Runner(cfg, out)
        triplets = epoch_triplets(runner, 0)
        return ours_triplets_s(runner), triplets
    finally:
        shutil.rmtree(out, ignore_errors=True)  # the temporary folder this function made
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


# -- the lines --------------------------------------------------------------------------------------------------------
#: issue 51's target: our training step at least this many times the peer's triplets/s
TARGET_RATIO = 1.5


def headline(result: PeerResult) -> str:
    """``peer_sentence_transformers_triplets_s: <x> (<what ran>)``."""
    return f"{HEADLINE}: {result.triplets_s:.1f} ({result.label()})"


def ratio(ours_triplets_s: float, peer: PeerResult) -> float:
    """Our triplets/s over the peer's (the same triplets, batch, length, precision and GPU)."""
    return ours_triplets_s / peer.triplets_s


def ratio_line(ours_triplets_s: float, peer: PeerResult) -> str:
    """``ours_over_sentence_transformers: <r>x (ours <a>, sentence-transformers <b> triplets/s; target >= 1.5x:
    met|not met)``: for the item that measures our step to print beside :func:`headline`."""
    r = ratio(ours_triplets_s, peer)
    return (
        f"ours_over_sentence_transformers: {r:.2f}x (ours {ours_triplets_s:.1f}, sentence-transformers "
        f"{peer.triplets_s:.1f} triplets/s; target >= {TARGET_RATIO}x: {'met' if r >= TARGET_RATIO else 'not met'})"
    )


def run(args: argparse.Namespace, devices: Devices) -> None:
    print(
        "\n8. a peer: sentence-transformers' own trainer (MiniLM, MultipleNegativesRankingLoss on data=arguana's "
        "epoch-0 triplets, 16 triplets x 128 tok, bf16)"
    )
    if not devices.cuda:
        print("   skipped (no CUDA device: the peer is a GPU figure, and a CPU one cannot stand in for it)")
        return
    if not corpus_found(args.corpus):
        return
    try:  # the peer never stops the bench: whatever fails is one line
        cfg = compose_config(TRIPLET_OVERRIDES)
        ours, triplets = ours_and_triplets(cfg)
        print(f"ours_triplets_s: {ours:.1f} (our trainer's epoch 0 on these triplets, pair classifier included)")
        result = bench_sentence_transformers(triplets, cfg.model.encoder.name_or_path, devices.cuda)
    except Exception as error:
        print(f"{HEADLINE}: not measured ({one_line(error)})")
        return
    print(headline(result))
    print(ratio_line(ours, result))
