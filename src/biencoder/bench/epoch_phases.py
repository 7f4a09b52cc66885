"""An epoch by phase, through the runner's own methods (items 4 and 6).

:func:`bench_epoch_phases` builds the :class:`~biencoder.engine.training.runner.Runner` of a composed run, puts a
:class:`~biencoder.bench.common.PhaseTimer` in its :attr:`Runner.phase` hook and runs its own
:meth:`Runner.run_epoch`: mine, train, per split encode and retrieve + rerank, keep best when val improved, log,
``last.pt`` (what stays on the training path: the copy of the state, and a wait for the previous write if it is still
in flight; the write itself runs in a thread, seen only in what it slows down). A frozen run whose embedding cache
is cold warms it first, and says so; a trained encoder's run says whether its token ids came from the token cache.
"""

from __future__ import annotations

import functools
import math
import shutil
import tempfile
import time
from pathlib import Path

import torch

from biencoder.bench.common import PhaseTimer, compose_config, device_label
from biencoder.engine.data.corpus import run_splits
from biencoder.engine.machine.rng import rng_states
from biencoder.engine.machine.runtime import decide
from biencoder.engine.modeling.cache import encoder_fingerprint, model_cache
from biencoder.engine.modeling.encoding import TokenizedTexts
from biencoder.engine.modeling.model import build_model
from biencoder.engine.modeling.token_cache import TokenCache
from biencoder.engine.training.evaluation import SPLITS
from biencoder.engine.training.runner import Runner


def cache_report(cfg) -> str | None:
    """For a frozen-encoder config: None when the embedding cache holds every text the run encodes, else a line
    saying how many are missing (the runner then encodes them). The texts are the runner's own
    (:func:`biencoder.engine.data.corpus.run_splits`), the cache the one
    :func:`biencoder.engine.modeling.encoding.pooled_vectors` fills."""
    _, splits = run_splits(cfg.data)
    texts = [text for split in splits.values() for text in split.texts]
    model, tokenizer = build_model(cfg.model, progress=False)
    dtype = decide(cfg.trainer.device, cfg.trainer.precision, environ={}).autocast_dtype  # as the runner decides
    cache = model_cache(
        model, tokenizer, cfg.model.max_length, cfg.trainer.cache_dir, encoder_fingerprint(model.encoder), dtype
    )
    missing = cache.missing(texts)
    if not missing:
        return None
    return (
        f"embedding cache cold: {missing} of {len(set(texts))} texts missing in {cache.folder}; warming it now "
        "(the runner encodes them once; the real corpus's 8548 texts took 4-10 min on 2 CPU cores)"
    )


def checkpoint_at_share(runner, best: dict, train_sim: torch.Tensor, epochs: int, timer: PhaseTimer) -> None:
    """When the ``epochs`` timed epochs wrote no ``last.pt`` (``frozen_arguana``: every 10th of 20 epochs), one write
    of it with the run's real state, added to ``timer`` at the share of epochs the runner writes it in (every
    ``checkpoint_every``-th and the last: ceil(E / every) of E epochs). When they wrote it, those writes are the
    measure: exact for every epoch (the default), the timed window's own share for another ``checkpoint_every``."""
    total, every = runner.settings.max_epochs, runner.settings.checkpoint_every
    if not every or "checkpoint" in timer.wall:
        return  # never written, or written (and timed) by the runner's own epochs
    runner.folder.last_writer.wait()  # no earlier write in flight: the phase is the snapshot alone
    one = PhaseTimer(runner.device)
    one("checkpoint", lambda: runner.save_last(0, best, train_sim, [rng_states()]))
    scale = epochs * math.ceil(total / every) / total
    for name in ("checkpoint", "epoch"):
        timer.add(name, one.wall["checkpoint"] * scale, one.cpu["checkpoint"] * scale)


def _tokenise_seconds(runner) -> dict[str, float]:
    """What :class:`Runner`'s set-up does for a trained encoder when the token cache lacks a split, timed again on its
    own: tokenising each split."""
    out = {}
    if not runner.frozen:
        for name in SPLITS:
            begin = time.perf_counter()
            TokenizedTexts(runner.data.splits[name].texts, runner.tokenizer, runner.text_encoder.max_length)
            out[f"tokenise {name} (once)"] = time.perf_counter() - begin
    return out


def token_report(runner) -> str | None:
    """For a trained encoder: where the runner's set-up got each split's token ids (the token cache under
    ``trainer.cache_dir``, or tokenised and stored there), and how long reading all of them from that cache takes
    (what every later run of the corpus pays instead of tokenising). None for a frozen encoder."""
    if runner.frozen:
        return None
    cached = runner.inputs.tokens_cached
    source = ", ".join(f"{name} {'from the token cache' if cached[name] else 'tokenised'}" for name in SPLITS)
    cache = TokenCache(runner.text_encoder.cache_dir, runner.tokenizer, runner.text_encoder.max_length)
    begin = time.perf_counter()
    hits = [cache.tokenized(runner.data.splits[name].texts, f"tokens {name}")[1] for name in SPLITS]
    seconds = time.perf_counter() - begin
    read = f"reading all three from it: {1000 * seconds:.0f} ms" if all(hits) else "the token cache is not written"
    return f"token ids in the runner's set-up: {source}; {read}"


def _timed_epochs(runner, epochs: int) -> PhaseTimer:
    """The runner's epochs 0..``epochs`` through its phase hook; epoch 0 warms caches and allocators and is not
    counted. ``last.pt`` that those epochs do not write counts at its share (:func:`checkpoint_at_share`)."""
    timer = runner.phase = PhaseTimer(runner.device)
    _, best, train_sim = runner.begin()
    for epoch in range(epochs + 1):
        if epoch == 1:
            timer.wall.clear(), timer.cpu.clear()
        train_sim, best = timer("epoch", functools.partial(runner.run_epoch, epoch, train_sim, best))
    checkpoint_at_share(runner, best, train_sim, epochs, timer)
    return timer


def _per_epoch(seconds: dict[str, float], epochs: int) -> dict[str, float]:
    """Seconds per epoch of each phase, ``rest`` (what no phase holds: the negatives' statistics, the log line, the
    loop) and ``epoch`` last."""
    table = {name: total / epochs for name, total in seconds.items()}
    table["rest"] = table["epoch"] - sum(v for k, v in table.items() if k != "epoch")
    table["epoch"] = table.pop("epoch")
    return table


def bench_epoch_phases(overrides: list[str], epochs: int = 3, say=print) -> dict:
    """Seconds per phase of one epoch (mean over ``epochs`` after one warm-up epoch) of the run ``overrides`` make:
    the runner's own :meth:`Runner.run_epoch`, timed through its :attr:`Runner.phase` hook (``rest`` is what no
    phase holds). Tokenising (trained encoder) happens in the runner's set-up, from the token cache once a run has
    filled it; it is timed again on its own, uncached, and ``tokens`` (:func:`token_report`) says where the
    set-up's ids came from. A frozen run whose embedding cache is cold warms it first (and ``say`` says so)."""
    cfg = compose_config(overrides)
    if cfg.model.encoder.freeze:
        cold = cache_report(cfg)
        if cold:
            say(f"   {cold}")
    out = Path(tempfile.mkdtemp(prefix="bench-epoch-"))
    try:
        start = time.perf_counter()
        runner = Runner(cfg, out)
        setup = time.perf_counter() - start
        tokenise = _tokenise_seconds(runner)
        tokens = token_report(runner)
        timer = _timed_epochs(runner, epochs)
        runner.folder.last_writer.wait()  # the last last.pt write, in the background, ends before its folder goes
        return {
            "device": device_label(runner.device),
            "tokens": tokens,
            "steps": runner.trainer.steps_per_epoch,
            "triplets": runner.trainer.n_triplets,
            "step": "CUDA graph" if runner.trainer.mode.graphs else "eager",
            "setup_s": setup,
            "checkpoint_every": cfg.trainer.checkpoint_every,
            "phases": {**tokenise, **_per_epoch(timer.wall, epochs)},
            "cpu": _per_epoch(timer.cpu, epochs),
        }
    finally:
        shutil.rmtree(out, ignore_errors=True)  # the temporary folder this function made


def print_phases(result: dict) -> None:
    """Wall and process CPU milliseconds per phase. On a CPU shared with other work, CPU time (all threads of this
    process) is the steadier figure: with one thread (OMP_NUM_THREADS=1) it is the wall time the phase would take
    on an idle core."""
    every = result["checkpoint_every"]
    print(
        f"   {result['device']}, {result['steps']} steps per epoch, runner set-up {result['setup_s']:.1f} s"
        + (
            ""
            if not every
            else "; last.pt every epoch"
            if every == 1
            else f"; last.pt every {every} epochs and after the last, counted at its share"
        )
    )
    if result.get("tokens"):
        print(f"   {result['tokens']}")
    print(f"   {'phase':<28} {'wall ms':>9} {'CPU ms':>9}")
    for name, seconds in result["phases"].items():
        cpu = result["cpu"].get(name)
        print(f"   {name:<28} {1000 * seconds:9.1f} {'' if cpu is None else f'{1000 * cpu:9.1f}':>9}")
