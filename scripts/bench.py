"""Benchmarks of biencoder's hot paths, printed as one table (see BENCHMARKS.md for recorded figures).

    python scripts/bench.py                  # CPU: about 2 minutes on 2 cores
    python scripts/bench.py --gpu-only       # on a CUDA machine: the GPU training rows (MFU) only

1. Evaluation of one split (the real test split when the corpus is found, else the demo's): the batched
   retrieve-and-rerank of :func:`biencoder.evaluate.retrieve_rerank` against a faithful re-implementation of the
   seed scripts' evaluator (a BallTree query per query, then one classifier call per (query, candidate) pair with
   a host→device copy each time), on the same embeddings; both must give the same top-1.
2. Training throughput (full fine-tuning step: encoder forward + backward + AdamW) in triplets/s and tokens/s:
   the tiny model on the CPU, and MiniLM-sized and bert-base-sized random-init encoders on CUDA with an MFU
   estimate for bf16 (6·params·tokens + attention FLOPs, against the GPU's dense bf16 peak).
3. Mining cost: all-points k-NN (k = 10) over N = 1k, 4k, 16k synthetic 128-d embeddings, BallTree vs exact
   search, with the growth exponent b of seconds ∝ N^b.
4. One frozen real-corpus epoch of ``+experiment=frozen_arguana`` (``ln_relu``), by phase: mine, train, and per
   split embed + retrieve + rerank, then logging and checkpoint; the runner's own methods, timed over 3 epochs
   after one warm-up. Needs Hydra, the packaged MiniLM and a warm embedding cache (it says how to warm it).

Items 1-3 need only torch, transformers, scikit-learn and numpy (Hydra is not imported), so they run on a bare
GPU image; item 4 is skipped where Hydra or the corpus is missing.
The last line printed is ``eval_speedup_vs_seed_style: <ratio>`` (the CPU ratio of item 1).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from biencoder.corpus import read_corpus  # noqa: E402
from biencoder.evaluate import retrieve_rerank  # noqa: E402
from biencoder.model import BiModel, Embeddings  # noqa: E402
from biencoder.search import NeighbourIndex  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CORPUS = Path(os.environ.get("ARGUANA_ROOT", REPO.parent / "shared/data/arguana-counterargs-corpus"))
#: dense bf16 peak (TFLOP/s, no sparsity) of GPUs this was run on; others print MFU as n/a
PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L4": 121.0, "A10": 125.0}


def device_label(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({torch.get_num_threads()} threads)"


def timed(fn, repeat: int = 1, sync: torch.device | None = None) -> tuple[float, object]:
    """Best-of-``repeat`` wall seconds of ``fn()`` and its last result."""
    best, out = math.inf, None
    for _ in range(repeat):
        if sync is not None and sync.type == "cuda":
            torch.cuda.synchronize(sync)
        start = time.perf_counter()
        out = fn()
        if sync is not None and sync.type == "cuda":
            torch.cuda.synchronize(sync)
        best = min(best, time.perf_counter() - start)
    return best, out


def bert_config(kind: str):
    from transformers import BertConfig

    sizes = {"tiny": dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64),
             "minilm": dict(num_hidden_layers=6, hidden_size=384, num_attention_heads=12, intermediate_size=1536),
             "bert-base": dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12, intermediate_size=3072)}
    return BertConfig(vocab_size=30522, max_position_embeddings=512, **sizes[kind])


def random_model(kind: str, device: torch.device, use_layernorm=True, use_relu=True) -> BiModel:
    from transformers import BertModel

    torch.manual_seed(0)
    return BiModel(BertModel(bert_config(kind)), pooling="mean", use_layernorm=use_layernorm,
                   use_relu=use_relu).to(device)


# -- 1. evaluation --------------------------------------------------------------------------------------------
def seed_style_top1(model: BiModel, emb: Embeddings, split, k: int, device: torch.device) -> float:
    """The seed scripts' evaluator, made correct (same pool as ours) but kept at its speed: per query a BallTree
    query, then per candidate one classifier call on one pair, with the vectors copied host→device each time."""
    sim, pooled = emb.sim.numpy(), emb.pooled.numpy()
    tree = NeighbourIndex(sim, "balltree")
    extra = 1 + int(split.twins_of_true_counter().max())
    hits = 0
    model.eval()
    with torch.no_grad():
        for q, true_counter in zip(split.query, split.counter):
            _, rows = tree.query(sim[q:q + 1], k + extra)
            rows = np.array([r for r in rows[0] if r != q and not (  # the pool rule, one candidate at a time
                split.is_counter[r] and split.text_id[r] == split.text_id[true_counter] and r != true_counter)][:k])
            scores = []
            for row in rows:
                a = Embeddings(torch.from_numpy(sim[q:q + 1]).to(device), torch.from_numpy(pooled[q:q + 1]).to(device))
                b = Embeddings(torch.from_numpy(sim[row:row + 1]).to(device),
                               torch.from_numpy(pooled[row:row + 1]).to(device))
                logits = model.classify_pair(a, b)[0]
                scores.append((logits[1] - logits[0]).item())  # ranked by logit margin, as ours
            scores = np.array(scores)
            is_true = rows == true_counter
            hits += bool(is_true.any() and (scores[~is_true] < scores[is_true][0]).all())
    return hits / len(split.query)


def bench_eval(corpus_root: Path, device: torch.device, k: int = 10) -> dict:
    if (corpus_root / "02-extracted-arguments").is_dir() or (corpus_root / "test").is_dir():
        split, name = read_corpus(corpus_root).paired("test"), "ArguAna test"
    else:
        split, name = read_corpus("demo").paired("test"), "demo test"
    model = random_model("minilm", device)  # only the heads are used: embeddings are given
    gen = torch.Generator().manual_seed(0)
    n = len(split.texts)
    pooled = torch.randn(n, 384, generator=gen)
    # make the true counter findable, so that top-1 is not trivially 0
    pooled[split.counter] = pooled[split.query] + 0.5 * torch.randn(len(split.query), 384, generator=gen)
    with torch.no_grad():
        emb = Embeddings(model.sim_head(pooled.to(device)).float().cpu(), pooled)
    t_ours, (metrics, _) = timed(lambda: retrieve_rerank(model, emb, split, k, device=device), repeat=3, sync=device)
    t_ours_exact, (metrics_exact, _) = timed(
        lambda: retrieve_rerank(model, emb, split, k, device=device, index="exact"), repeat=3, sync=device)
    t_seed, seed_top1 = timed(lambda: seed_style_top1(model, emb, split, k, device), sync=device)
    assert abs(seed_top1 - metrics["top1"]) < 1e-12 and metrics_exact["top1"] == metrics["top1"], \
        (seed_top1, metrics["top1"], metrics_exact["top1"])
    return {"split": f"{name} ({len(split.query)} queries, k={k})", "ours_s": t_ours, "ours_exact_s": t_ours_exact,
            "seed_s": t_seed, "top1": metrics["top1"], "speedup": t_seed / t_ours,
            "speedup_exact": t_seed / t_ours_exact}


# -- 2. training throughput -----------------------------------------------------------------------------------
def train_flops_per_step(config, batch_seqs: int, seq_len: int) -> float:
    """Forward+backward FLOPs of one step: 6·N·tokens for the matmul weights (N without embeddings) plus
    attention scores and values, 12·layers·seq²·hidden per sequence (forward 4·…, backward twice that)."""
    h, layers, inter = config.hidden_size, config.num_hidden_layers, config.intermediate_size
    weights = layers * (4 * h * h + 2 * h * inter)
    return 6 * weights * batch_seqs * seq_len + 12 * layers * seq_len * seq_len * h * batch_seqs


def bench_train(kind: str, device: torch.device, batch: int, seq_len: int, steps: int, dtype) -> dict:
    from biencoder.loss import TripletCELoss

    model = random_model(kind, device)
    model.train()
    loss_fn = TripletCELoss()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 30000, (3 * batch, seq_len), generator=gen)
    mask = torch.ones_like(ids)
    if device.type == "cuda":
        ids, mask = ids.pin_memory(), mask.pin_memory()

    def step():
        i, m = ids.to(device, non_blocking=True), mask.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            point, counter, negative = model.embed(i, m).chunk(3)
            out = loss_fn(model, point, counter, negative)
        optimizer.zero_grad(set_to_none=True)
        out.total.backward()
        optimizer.step()

    for _ in range(2):  # warm-up (allocator, kernels)
        step()
    seconds, _ = timed(lambda: [step() for _ in range(steps)], sync=device)
    per_step = seconds / steps
    tokens = 3 * batch * seq_len
    flops = train_flops_per_step(model.encoder.config, 3 * batch, seq_len)
    peak = next((v for k, v in PEAK_BF16_TFLOPS.items() if k in device_label(device)), None)
    mfu = (flops / per_step) / (peak * 1e12) if (peak and device.type == "cuda" and dtype == torch.bfloat16) else None
    return {"model": kind, "batch": f"{batch} triplets x {seq_len} tok", "precision": "bf16" if dtype else "fp32",
            "triplets_s": batch / per_step, "tokens_s": tokens / per_step, "tflops": flops / per_step / 1e12,
            "mfu": mfu}


# -- 3. mining ------------------------------------------------------------------------------------------------
def bench_mining(device: torch.device, sizes=(1000, 4000, 16000), dim: int = 128, k: int = 10) -> list[dict]:
    rows = []
    for kind in ("balltree", "exact"):
        times = []
        for n in sizes:
            data = np.random.default_rng(n).normal(size=(n, dim)).astype(np.float32)
            seconds, _ = timed(lambda: NeighbourIndex(data, kind, device).query(data, k), sync=device)
            times.append(seconds)
        exponent = np.polyfit(np.log(sizes), np.log(times), 1)[0]
        rows.append({"index": kind, "times": times, "exponent": exponent})
    return rows


# -- 4. a frozen real-corpus epoch, by phase -------------------------------------------------------------------
def bench_frozen_epoch(corpus_root: Path, epochs: int = 3) -> dict | str:
    """Seconds per phase of one frozen epoch (mean over ``epochs`` after a warm-up), or why it was skipped."""
    try:
        from hydra import compose, initialize_config_dir

        from biencoder.cache import EmbeddingCache, encoder_fingerprint, tokenizer_fingerprint
        from biencoder.config import register
        from biencoder.state import rng_states
        from biencoder.train import Runner
    except ImportError as err:
        return f"skipped ({err})"
    if not ((corpus_root / "02-extracted-arguments").is_dir() or (corpus_root / "test").is_dir()):
        return f"skipped (no corpus at {corpus_root})"
    register()
    os.environ["ARGUANA_ROOT"] = str(corpus_root)
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", ["+experiment=frozen_arguana", "+variant=ln_relu", "trainer.progress=false"])
    # a cold cache would turn this item into a 5-10 minute encoding run: check first, encode nothing
    from biencoder.model import build_model

    model, tokenizer = build_model(cfg.model, progress=False)
    pairs = read_corpus(corpus_root).pairs  # the texts a run encodes: those of pairs
    texts = sorted(set(pairs["point_text"]) | set(pairs["counter_text"]))
    cache = EmbeddingCache(cfg.trainer.cache_dir, encoder_fingerprint(model.encoder), tokenizer_fingerprint(tokenizer),
                           cfg.model.pooling, cfg.model.max_length)

    class Cold(Exception):
        pass

    def cold(rows):
        raise Cold(len(rows))

    try:
        cache.get(texts, cold)
    except Cold as err:
        return (f"skipped (embedding cache cold: {err.args[0]} texts missing; warm it once with python -m "
                "biencoder.train +experiment=frozen_arguana trainer.max_epochs=1, 5-10 min on 2 cores)")
    import tempfile

    runner = Runner(cfg, Path(tempfile.mkdtemp(prefix="bench-frozen-")))
    times: dict[str, float] = {}

    def timed_phase(name, fn):
        start = time.perf_counter()
        out = fn()
        times[name] = times.get(name, 0.0) + time.perf_counter() - start
        return out

    train_sim = runner.embed("train").sim
    best = {"epoch": -1, "val_top1": 0.0, "metrics": None, "state": None, "hits": None}
    for epoch in range(epochs + 1):
        if epoch == 1:
            times.clear()  # epoch 0 warms caches and allocators
        start = time.perf_counter()
        negatives = timed_phase("mine", lambda: runner.mine(epoch, train_sim))
        timed_phase("train", lambda: runner.train_epoch(epoch, negatives))
        for name in ("train", "val", "test"):
            emb = timed_phase(f"embed {name}", lambda: runner.embed(name))
            timed_phase(f"retrieve+rerank {name}", lambda: runner.evaluate_split(name, emb, epoch))
            if name == "train":
                train_sim = emb.sim
        timed_phase("log + checkpoint", lambda: (runner.folder.append([{"epoch": epoch}]),
                                                 runner.save_last(epoch, best, train_sim, [rng_states()])))
        times["epoch"] = times.get("epoch", 0.0) + time.perf_counter() - start
    return {name: seconds / epochs for name, seconds in times.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS, help="ArguAna root (default: ARGUANA_ROOT)")
    parser.add_argument("--gpu-only", action="store_true", help="only the CUDA training rows")
    parser.add_argument("--steps", type=int, default=10, help="timed training steps per row")
    parser.add_argument("--skip-frozen", action="store_true", help="skip item 4 (the frozen real-corpus epoch)")
    args = parser.parse_args(argv)
    cpu = torch.device("cpu")
    cuda = torch.device("cuda") if torch.cuda.is_available() else None
    print(f"biencoder bench | torch {torch.__version__} | CPU threads {torch.get_num_threads()} | "
          f"GPU {device_label(cuda) if cuda else 'none'}")

    speedup = None
    if not args.gpu_only:
        print("\n1. evaluation of one split: batched retrieve+rerank vs seed-style per-pair loop (same top-1)")
        print(f"{'device':<22} {'split':<36} {'ours s':>8} {'ours(exact) s':>14} {'seed-style s':>13} {'speedup':>9} {'(exact)':>9}")
        for device in [cpu] + ([cuda] if cuda else []):
            r = bench_eval(args.corpus, device)
            print(f"{device_label(device):<22} {r['split']:<36} {r['ours_s']:>8.3f} {r['ours_exact_s']:>14.3f} "
                  f"{r['seed_s']:>13.2f} {r['speedup']:>8.1f}x {r['speedup_exact']:>8.1f}x")
            if device == cpu:
                speedup = r["speedup"]

    print("\n2. training throughput (encoder fwd+bwd+AdamW, random init)")
    print(f"{'device':<22} {'model':<10} {'batch':<22} {'prec':<5} {'triplets/s':>11} {'tokens/s':>10} {'TFLOP/s':>8} {'MFU':>6}")
    rows = []
    if not args.gpu_only:
        rows.append((cpu, bench_train("tiny", cpu, 16, 128, args.steps, None)))
        rows.append((cpu, bench_train("minilm", cpu, 16, 128, max(2, args.steps // 5), None)))
    if cuda:
        for kind, batch in (("minilm", 64), ("bert-base", 32)):
            rows.append((cuda, bench_train(kind, cuda, batch, 256, args.steps, torch.bfloat16)))
            rows.append((cuda, bench_train(kind, cuda, batch, 256, args.steps, None)))
    for device, r in rows:
        mfu = f"{100 * r['mfu']:.0f}%" if r["mfu"] is not None else "n/a"
        print(f"{device_label(device):<22} {r['model']:<10} {r['batch']:<22} {r['precision']:<5} {r['triplets_s']:>11.1f} "
              f"{r['tokens_s']:>10.0f} {r['tflops']:>8.2f} {mfu:>6}")
    if not cuda:
        print(f"{'GPU':<22} {'minilm':<10} {'64 triplets x 256 tok':<22} {'bf16':<5} {'not measured (no CUDA device)':>37}")
        print(f"{'GPU':<22} {'bert-base':<10} {'32 triplets x 256 tok':<22} {'bf16':<5} {'not measured (no CUDA device)':>37}")

    if not args.gpu_only:
        print("\n3. mining: k-NN (k=10) of all N points, 128-d, seconds (growth exponent b: s ~ N^b)")
        for device in [cpu] + ([cuda] if cuda else []):
            for r in bench_mining(device):
                if r["index"] == "balltree" and device != cpu:
                    continue  # the BallTree runs on the CPU whatever the device
                print(f"{device_label(device) if r['index'] == 'exact' else 'CPU (scikit-learn)':<22} {r['index']:<9} "
                      + "  ".join(f"N={n // 1000}k {t:7.3f}s" for n, t in zip((1000, 4000, 16000), r["times"]))
                      + f"   b={r['exponent']:.2f}")
        if not args.skip_frozen:
            print("\n4. one frozen real-corpus epoch (+experiment=frozen_arguana, ln_relu; mean of 3 after a warm-up)")
            phases = bench_frozen_epoch(args.corpus)
            if isinstance(phases, str):
                print(f"   {phases}")
            else:
                for name, seconds in phases.items():
                    print(f"   {name:<26} {1000 * seconds:8.1f} ms")
        print(f"\neval_speedup_vs_seed_style: {speedup:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
