"""Benchmarks of biencoder's hot paths, printed as one table (see BENCHMARKS.md for recorded figures).

    python scripts/bench.py                         # CPU: all items, a few minutes on 2 cores
    python scripts/bench.py --items frozen steps    # only some items (eval train mining frozen steps finetune)
    python scripts/bench.py --gpu-only             # on a CUDA machine (refused without one): items 2, 5, 6
    python scripts/bench.py --items sweep --jobs 4 8 12   # on a CUDA machine: item 7 (20 runs per job count)

1. Evaluation of one split (the real test split when the corpus is found, else the demo's): the batched
   retrieve-and-rerank of :func:`biencoder.engine.rerank.retrieve_rerank` against a faithful re-implementation of the
   seed scripts' evaluator (a BallTree query per query, then one classifier call per (query, candidate) pair with
   a host→device copy each time), on the same embeddings; both must give the same top-1.
2. Training throughput (full fine-tuning step: encoder forward + backward + AdamW) in triplets/s and tokens/s:
   the tiny model on the CPU, and MiniLM-sized and bert-base-sized random-init encoders on CUDA with an MFU
   estimate for bf16 (6·params·tokens + attention FLOPs, against the GPU's dense bf16 peak).
3. Mining cost: all-points k-NN (k = 10) over N = 1k, 4k, 16k synthetic 128-d embeddings, BallTree vs exact
   search, with the growth exponent b of seconds ∝ N^b.
4. One frozen real-corpus epoch of ``+experiment=frozen_arguana`` (``ln_relu``), by phase, through the runner's
   own methods (mean of ``--epochs`` after one warm-up; ``last.pt`` at the share of epochs the runner writes it in);
   prints ``frozen_epoch_s: <seconds>``. A cold embedding
   cache is warmed first (it says so; 4-10 min on 2 cores for the real corpus).
5. One training step (:meth:`biencoder.engine.epoch.EpochTrainer.train_step` on a ready batch, demo corpus) of the MiniLM-sized
   encoder (random init, trained) and of the frozen-encoder head: operator calls and host synchronisations per step,
   counted with ``torch.profiler`` over 32 (frozen) or 8 steps, so that the step statistics, computed on one step in 8
   (:class:`biencoder.engine.epoch.EpochSums`), count at their share; and ms per step.
6. One fine-tuning epoch by phase (tokenise, mine, train, encode and retrieve + rerank per split, log, checkpoint):
   the default run on ``data=arguana`` on CUDA, the tiny model on the demo corpus on a CPU; prints
   ``finetune_epoch_s``.
7. (CUDA; only with ``--items sweep``) the 20-run fine-tuning ablation on ``data=arguana`` as a real
   Hydra multirun with ``--jobs`` concurrent jobs; prints ``ablation_wall_s: <seconds> (jobs N)`` per job count.

Importing this file imports neither Hydra nor the packaged MiniLM (items 4-6 import them when run), so items 1-3
run on a bare GPU image. The last line printed is ``eval_speedup_vs_seed_style: <ratio>`` when item 1 ran.
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

from biencoder.engine.corpus import read_corpus  # noqa: E402
from biencoder.engine.layout import CorpusError, resolve_root  # noqa: E402
from biencoder.engine.rerank import retrieve_rerank  # noqa: E402
from biencoder.engine.runtime import Runtime  # noqa: E402
from biencoder.engine.model import BiModel, Embeddings  # noqa: E402
from biencoder.engine.search import NeighbourIndex  # noqa: E402

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


def bert_sizes() -> dict[str, dict[str, int]]:
    """Layers and widths of the random-init BERT encoders benchmarked here."""
    return {"tiny": dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64),
             "minilm": dict(num_hidden_layers=6, hidden_size=384, num_attention_heads=12, intermediate_size=1536),
             "bert-base": dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12, intermediate_size=3072)}


def bert_config(kind: str):
    from transformers import BertConfig

    return BertConfig(vocab_size=30522, max_position_embeddings=512, **bert_sizes()[kind])


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


def is_corpus(root: Path) -> bool:
    """Whether ``root`` holds the ArguAna layout, as the reader decides it (:func:`resolve_root`)."""
    try:
        resolve_root(root)
    except CorpusError:
        return False
    return True


def bench_eval(corpus_root: Path, device: torch.device, k: int = 10) -> dict:
    if is_corpus(corpus_root):
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
    size = Runtime(device, "fp32").pair_batch_size(None)  # the block size a run uses on this device
    t_ours, (metrics, _) = timed(lambda: retrieve_rerank(model, emb, split, k, size, device=device), repeat=3,
                                 sync=device)
    t_ours_exact, (metrics_exact, _) = timed(
        lambda: retrieve_rerank(model, emb, split, k, size, device=device, index="exact"), repeat=3, sync=device)
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
    from biencoder.engine.flat import FlatParameters
    from biencoder.engine.loss import TripletCELoss

    model = random_model(kind, device)
    model.train()
    loss_fn = TripletCELoss()
    # as the runner's (EpochTrainer): fused AdamW over the parameters as one flat tensor (one group here, not two)
    flat = FlatParameters(list(model.parameters()), model.unused_parameters())
    optimizer = torch.optim.AdamW(flat.tensors(), lr=1e-5, fused=True)
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
        optimizer.zero_grad(set_to_none=False)
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


# -- 4 and 6. an epoch by phase, through the runner's own methods ---------------------------------------------------
def compose_config(overrides: list[str]):
    """The real configs of ``conf/`` composed with ``overrides`` and validated, as a run's are (Hydra is imported
    here, not at module level)."""
    from hydra import compose, initialize_config_dir

    from biencoder.engine.validation import validate
    from biencoder.hydra_glue import register

    register()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", list(overrides))
    validate(cfg)
    return cfg


def cache_report(cfg) -> str | None:
    """For a frozen-encoder config: None when the embedding cache holds every text the run encodes, else a line
    saying how many are missing (the runner then encodes them). The texts are the runner's own
    (:func:`biencoder.engine.corpus.run_splits`), the cache the one :func:`biencoder.engine.model.pooled_vectors` fills."""
    from biencoder.engine.cache import encoder_fingerprint, model_cache
    from biencoder.engine.corpus import run_splits
    from biencoder.engine.model import build_model
    from biencoder.engine.runtime import decide

    _, splits = run_splits(cfg.data)
    texts = [text for split in splits.values() for text in split.texts]
    model, tokenizer = build_model(cfg.model, progress=False)
    dtype = decide(cfg.trainer.device, cfg.trainer.precision, environ={}).autocast_dtype  # as the runner decides
    cache = model_cache(model, tokenizer, cfg.model.max_length, cfg.trainer.cache_dir,
                        encoder_fingerprint(model.encoder), dtype)
    missing = cache.missing(texts)
    if not missing:
        return None
    return (f"embedding cache cold: {missing} of {len(set(texts))} texts missing in {cache.folder}; warming it now "
            "(the runner encodes them once; the real corpus's 8548 texts took 4-10 min on 2 CPU cores)")


class PhaseTimer:
    """Wall and process CPU seconds summed per phase name; on CUDA the device is synchronised around each phase."""

    def __init__(self, device: torch.device):
        self.device, self.wall, self.cpu = device, {}, {}

    def __call__(self, name: str, fn):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        begin, begin_cpu = time.perf_counter(), time.process_time()
        result = fn()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.add(name, time.perf_counter() - begin, time.process_time() - begin_cpu)
        return result

    def add(self, name: str, wall: float, cpu: float) -> None:
        self.wall[name] = self.wall.get(name, 0.0) + wall
        self.cpu[name] = self.cpu.get(name, 0.0) + cpu


def checkpoint_at_share(runner, best: dict, train_sim: torch.Tensor, epochs: int, timer: PhaseTimer) -> None:
    """When the ``epochs`` timed epochs wrote no ``last.pt`` (``frozen_arguana``: every 10th of 20 epochs), one write
    of it with the run's real state, added to ``timer`` at the share of epochs the runner writes it in (every
    ``checkpoint_every``-th and the last: ceil(E / every) of E epochs). When they wrote it, those writes are the
    measure: exact for every epoch (the default), the timed window's own share for another ``checkpoint_every``."""
    from biencoder.engine.state import rng_states

    total, every = runner.cfg.trainer.max_epochs, runner.cfg.trainer.checkpoint_every
    if not every or "checkpoint" in timer.wall:
        return  # never written, or written (and timed) by the runner's own epochs
    one = PhaseTimer(runner.device)
    one("checkpoint", lambda: runner.save_last(0, best, train_sim, [rng_states()]))
    scale = epochs * math.ceil(total / every) / total
    for name in ("checkpoint", "epoch"):
        timer.add(name, one.wall["checkpoint"] * scale, one.cpu["checkpoint"] * scale)


def bench_epoch_phases(overrides: list[str], epochs: int = 3, say=print) -> dict:
    """Seconds per phase of one epoch (mean over ``epochs`` after one warm-up epoch) of the run ``overrides`` make:
    the runner's own :meth:`Runner.run_epoch`, timed through its :attr:`Runner.phase` hook (mine, train, per split
    encode and retrieve + rerank, keep best when val improved, log, ``last.pt``; ``rest`` is what no phase holds).
    Tokenising (trained encoder) happens once per run, in the runner's set-up; it is timed again on its own. A
    ``last.pt`` that the timed epochs do not write counts at its share (:func:`checkpoint_at_share`). A frozen run
    whose embedding cache is cold warms it first (and ``say`` says so)."""
    import shutil
    import tempfile

    from biencoder.engine.model import TokenizedTexts
    from biencoder.engine.runner import SPLITS, Runner

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
        tokenise = {}
        if not runner.frozen:
            for name in SPLITS:  # what Runner.__init__ did, timed again on its own
                begin = time.perf_counter()
                TokenizedTexts(runner.splits[name].texts, runner.tokenizer, cfg.model.max_length)
                tokenise[f"tokenise {name} (once)"] = time.perf_counter() - begin
        timer = runner.phase = PhaseTimer(runner.device)
        _, best, train_sim = runner.begin()
        for epoch in range(epochs + 1):
            if epoch == 1:
                timer.wall.clear(), timer.cpu.clear()  # epoch 0 warms caches and allocators
            train_sim, best = timer("epoch", lambda: runner.run_epoch(epoch, train_sim, best))
        checkpoint_at_share(runner, best, train_sim, epochs, timer)
        phases = {name: seconds / epochs for name, seconds in timer.wall.items()}
        cpu = {name: seconds / epochs for name, seconds in timer.cpu.items()}
        for table in (phases, cpu):  # what no phase holds: the negatives' statistics, the log line, the loop
            table["rest"] = table["epoch"] - sum(v for k, v in table.items() if k != "epoch")
            table["epoch"] = table.pop("epoch")
        return {"device": device_label(runner.device), "steps": runner.trainer.steps_per_epoch, "setup_s": setup,
                "checkpoint_every": cfg.trainer.checkpoint_every, "phases": {**tokenise, **phases}, "cpu": cpu}
    finally:
        shutil.rmtree(out, ignore_errors=True)  # the temporary folder this function made


def frozen_overrides() -> list[str]:
    return ["+experiment=frozen_arguana", "+variant=ln_relu", "trainer.progress=false"]


def finetune_overrides(cuda: bool) -> list[str]:
    """The default fine-tuning run (data=arguana, MiniLM, exact search) on CUDA; the tiny model on the demo corpus on a
    CPU, so CI runs the same code."""
    common = ["+variant=ln_relu", "trainer.progress=false", "eval.tasks=false", "eval.index=exact",
              "negatives.index=exact"]
    return common + (["data=arguana"] if cuda else ["model=tiny"])


# -- 7. the 20-run fine-tuning ablation, wall clock -------------------------------------------------------------------
def sweep_command(jobs: int, log_dir: Path, extra: list[str]) -> tuple[list[str], dict[str, str]]:
    """The 20-run ablation (4 cells x 5 seeds, data=arguana, defaults otherwise) as a Hydra multirun of ``jobs``
    concurrent jobs on this machine (hydra/launcher=parallel), and its environment (one CPU thread share per job)."""
    command = [sys.executable, "-m", "biencoder.train", "-m", "hydra/launcher=parallel", "data=arguana",
               "+variant=glob(*)", "seed=0,1,2,3,4", "trainer.progress=false", f"paths.log_dir={log_dir}", *extra]
    threads = max(1, (os.cpu_count() or 1) // jobs)
    env = {**os.environ, "BIENCODER_JOBS": str(jobs), "OMP_NUM_THREADS": str(threads),
           "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    return command, env


def bench_sweep(jobs: int, extra: list[str]) -> float:
    """Wall seconds of :func:`sweep_command` (its run folders go to a temporary folder, removed after)."""
    import shutil
    import subprocess
    import tempfile

    log_dir = Path(tempfile.mkdtemp(prefix="bench-sweep-"))
    try:
        command, env = sweep_command(jobs, log_dir, extra)
        start = time.perf_counter()
        subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
        return time.perf_counter() - start
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)  # the temporary folder this function made


# -- 5. operator calls and host synchronisations per training step -------------------------------------------------
#: ops whose result is read by the host: .item(), bool(t), float(t), int(t) (aten::is_nonzero calls item)
SYNC_OPS = ("aten::_local_scalar_dense",)
#: CUDA runtime calls that block the host until the device is done
CUDA_SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")
#: Tensor methods that read data into Python without dispatching an op on a CPU tensor (on CUDA they copy and sync)
HOST_READS = ("tolist", "numpy")


#: fused AdamW's kernels: on a CPU they read each parameter's step counter, a CPU tensor (one read per parameter)
OPTIMIZER_KERNELS = ("aten::_fused_adamw_", "aten::_fused_adam_")


def _inside(event, names) -> bool:
    """Whether a profiler event runs inside (is called by) an op named in ``names``."""
    parent = event.cpu_parent
    while parent is not None and parent.name not in names:
        parent = parent.cpu_parent
    return parent is not None


def count_step(step, device: torch.device, steps: int) -> dict:
    """Profile ``steps`` calls of ``step()`` (after 2 warm-up calls); per step: ``ops`` (aten:: calls, nested ones
    included), ``syncs`` (host synchronisations: on CUDA the runtime's synchronising calls, copies to the CPU
    included (``cudaMemcpy``); on a CPU the host reads of tensor values, :data:`SYNC_OPS` plus Tensor.tolist()/numpy(),
    caught by a TorchFunctionMode since a CPU tensor's tolist() dispatches no op) with the names behind them, and
    ``exempt``: the reads inside fused AdamW's kernel (:data:`OPTIMIZER_KERNELS`) on a CPU, of its step counters, which are CPU
    tensors there: they wait for no device, so they are not counted as syncs."""
    from torch.overrides import TorchFunctionMode
    from torch.profiler import ProfilerActivity, profile

    reads: dict[str, int] = {}

    class HostReads(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            name = getattr(func, "__name__", "")
            if name in HOST_READS:
                reads[f"Tensor.{name}"] = reads.get(f"Tensor.{name}", 0) + 1
            return func(*args, **(kwargs or {}))

    for _ in range(2):
        step()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof, HostReads():
        for _ in range(steps):
            step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    ops, named, exempt = 0, {}, 0
    for event in prof.events():
        ops += event.name.startswith("aten::")
        if event.name in (CUDA_SYNCS if device.type == "cuda" else SYNC_OPS):
            if device.type == "cpu" and _inside(event, OPTIMIZER_KERNELS):
                exempt += 1
            else:
                named[event.name] = named.get(event.name, 0) + 1
    if device.type != "cuda":
        named.update(reads)
    seconds, _ = timed(lambda: [step() for _ in range(steps)], sync=device)
    return {"ops": ops / steps, "syncs": sum(named.values()) / steps, "exempt": exempt / steps,
            "sync_names": {k: v / steps for k, v in sorted(named.items())}, "ms": 1000 * seconds / steps}


def step_overrides(frozen: bool, cache_dir: Path, size: str = "minilm") -> list[str]:
    """One MiniLM-sized training step on the demo corpus: the encoder trained (random init of :func:`bert_sizes`
    ``size``, 16 triplets) or frozen (the packaged MiniLM's cached pooled vectors, the frozen_arguana head settings:
    32 triplets)."""
    if frozen:
        return ["+variant=ln_relu", "trainer.progress=false", "model.encoder.freeze=true", "model.pooling=mean",
                "trainer.batch_size=32", "trainer.head_lr=3e-4", f"trainer.cache_dir={cache_dir}",
                "eval.baselines=false"]
    return ["+variant=ln_relu", "trainer.progress=false", "model=tiny", "model.max_length=128",
            *(f"model.encoder.random_init.{k}={v}" for k, v in bert_sizes()[size].items()), "eval.baselines=false"]


def bench_step_counts(frozen: bool, steps: int, size: str = "minilm") -> dict:
    """:func:`count_step` of :meth:`EpochTrainer.train_step` for the MiniLM-sized model (trained: of ``size``) trained
    or frozen (demo corpus)."""
    import itertools
    import shutil
    import tempfile

    from biencoder.engine.epoch import EpochSums
    from biencoder.engine.runner import Runner

    scratch = Path(tempfile.mkdtemp(prefix="bench-step-"))
    try:
        runner = Runner(compose_config(step_overrides(frozen, scratch / "cache", size)), scratch / "run")
        negatives = runner.trainer.mine(0, runner.embed("train").sim)
        runner.model.train()
        runner.model.encoder.train(not runner.frozen)
        # the batches are assembled beforehand: a step here is EpochTrainer.train_step on a ready batch
        batches = itertools.islice((inputs for epoch in itertools.count()
                                    for _, inputs in runner.trainer.batches(epoch, negatives)), 2 * steps + 2)
        batches = iter(list(batches))
        sums = EpochSums(runner.cfg.trainer.stats_every)
        result = count_step(lambda: runner.trainer.train_step(next(batches), sums), runner.device, steps)
        return {"model": "MiniLM frozen head" if frozen else "MiniLM-sized", "device": device_label(runner.device),
                "batch": runner.cfg.trainer.batch_size, **result}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)  # the temporary folder this function made


def print_phases(result: dict) -> None:
    """Wall and process CPU milliseconds per phase. On a CPU shared with other work, CPU time (all threads of this
    process) is the steadier figure: with one thread (OMP_NUM_THREADS=1) it is the wall time the phase would take
    on an idle core."""
    every = result["checkpoint_every"]
    print(f"   {result['device']}, {result['steps']} steps per epoch, runner set-up {result['setup_s']:.1f} s"
          + ("" if not every else "; last.pt every epoch" if every == 1
             else f"; last.pt every {every} epochs and after the last, counted at its share"))
    print(f"   {'phase':<28} {'wall ms':>9} {'CPU ms':>9}")
    for name, seconds in result["phases"].items():
        cpu = result["cpu"].get(name)
        print(f"   {name:<28} {1000 * seconds:9.1f} {'' if cpu is None else f'{1000 * cpu:9.1f}':>9}")


ITEMS = ("eval", "train", "mining", "frozen", "steps", "finetune", "sweep")


def corpus_found(root: Path) -> bool:
    """Whether the real corpus is at ``root``: if so, the runs of items 4, 6 (CUDA) and 7 read it (``ARGUANA_ROOT``);
    if not, the item says it is skipped and why."""
    if not is_corpus(root):
        print(f"   skipped (no ArguAna corpus at {root}; set ARGUANA_ROOT or pass --corpus)")
        return False
    os.environ["ARGUANA_ROOT"] = str(root)
    return True


def item_eval(args, cpu, cuda) -> float | None:
    """1. Evaluation of one split; returns the CPU speedup over the seed-style loop."""
    speedup = None
    print("\n1. evaluation of one split: batched retrieve+rerank vs seed-style per-pair loop (same top-1)")
    print(f"{'device':<22} {'split':<36} {'ours s':>8} {'ours(exact) s':>14} {'seed-style s':>13} {'speedup':>9} "
          f"{'(exact)':>9}")
    for device in [cpu] + ([cuda] if cuda else []):
        r = bench_eval(args.corpus, device)
        print(f"{device_label(device):<22} {r['split']:<36} {r['ours_s']:>8.3f} {r['ours_exact_s']:>14.3f} "
              f"{r['seed_s']:>13.2f} {r['speedup']:>8.1f}x {r['speedup_exact']:>8.1f}x")
        if device == cpu:
            speedup = r["speedup"]
    return speedup


def item_train(args, cpu, cuda) -> None:
    """2. Training throughput."""
    print("\n2. training throughput (encoder fwd+bwd+AdamW, random init)")
    print(f"{'device':<22} {'model':<10} {'batch':<22} {'prec':<5} {'triplets/s':>11} {'tokens/s':>10} "
          f"{'TFLOP/s':>8} {'MFU':>6}")
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
        print(f"{device_label(device):<22} {r['model']:<10} {r['batch']:<22} {r['precision']:<5} "
              f"{r['triplets_s']:>11.1f} {r['tokens_s']:>10.0f} {r['tflops']:>8.2f} {mfu:>6}")
    if not cuda:
        for model, batch in (("minilm", "64 triplets x 256 tok"), ("bert-base", "32 triplets x 256 tok")):
            print(f"{'GPU':<22} {model:<10} {batch:<22} {'bf16':<5} {'not measured (no CUDA device)':>37}")


def item_mining(cpu, cuda) -> None:
    """3. Mining cost."""
    print("\n3. mining: k-NN (k=10) of all N points, 128-d, seconds (growth exponent b: s ~ N^b)")
    for device in [cpu] + ([cuda] if cuda else []):
        for r in bench_mining(device):
            if r["index"] == "balltree" and device != cpu:
                continue  # the BallTree runs on the CPU whatever the device
            print(f"{device_label(device) if r['index'] == 'exact' else 'CPU (scikit-learn)':<22} {r['index']:<9} "
                  + "  ".join(f"N={n // 1000}k {t:7.3f}s" for n, t in zip((1000, 4000, 16000), r["times"]))
                  + f"   b={r['exponent']:.2f}")


def item_steps() -> None:
    """5. Operator calls and host syncs per training step."""
    print("\n5. one training step (EpochTrainer.train_step, demo corpus): operator calls and host syncs per step")
    for frozen in (False, True):
        # a multiple of trainer.stats_every (8): the step statistics of one step in 8 count at their share
        r = bench_step_counts(frozen, steps=32 if frozen else 8)
        names = ", ".join(f"{k} {v:g}" for k, v in r["sync_names"].items()) or "none"
        print(f"   {r['model']:<20} {r['device']:<22} batch {r['batch']:>3}  ops/step {r['ops']:7.0f}  "
              f"host syncs/step {r['syncs']:5.1f} ({names}; not counted: {r['exempt']:g} reads of fused AdamW's CPU "
              f"step counters)  {r['ms']:8.1f} ms/step")


def item_frozen(args) -> None:
    """4. The frozen real-corpus epoch by phase."""
    print(f"\n4. one frozen real-corpus epoch (+experiment=frozen_arguana, ln_relu; mean of {args.epochs} after a "
          "warm-up)")
    if corpus_found(args.corpus):
        result = bench_epoch_phases(frozen_overrides(), args.epochs)
        print_phases(result)
        print(f"frozen_epoch_s: {result['phases']['epoch']:.3f}")
        print(f"frozen_epoch_cpu_s: {result['cpu']['epoch']:.3f}")


def item_finetune(args, cuda) -> None:
    """6. The fine-tuning epoch by phase."""
    overrides = finetune_overrides(cuda is not None)
    print(f"\n6. one fine-tuning epoch by phase ({' '.join(overrides)}; mean of {args.epochs} after a warm-up)")
    if cuda and not corpus_found(args.corpus):
        return
    result = bench_epoch_phases(overrides, args.epochs)
    print_phases(result)
    print(f"finetune_epoch_s: {result['phases']['epoch']:.3f}")


def item_sweep(args, cuda) -> None:
    """7. The 20-run fine-tuning ablation (CUDA)."""
    print("\n7. the 20-run fine-tuning ablation (data=arguana, 4 cells x 5 seeds, defaults; hydra/launcher=parallel)")
    if not cuda:
        print("   skipped (no CUDA device: 20 fine-tuning runs take days on a CPU)")
    elif corpus_found(args.corpus):
        for jobs in args.jobs:
            print(f"ablation_wall_s: {bench_sweep(jobs, []):.1f} (jobs {jobs})")


def chosen_items(args) -> set[str]:
    """The items ``args`` ask for: ``--gpu-only`` keeps the GPU targets of the step and the epoch (2, 5, 6); the
    ablation (7: 20 runs per job count) runs only when named, ``--items sweep``."""
    items = set(args.items) - ({"frozen"} if args.skip_frozen else set())
    if args.gpu_only:
        items &= {"train", "steps", "finetune", "sweep"}
    if args.items == list(ITEMS):
        items.discard("sweep")
    return items


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS, help="ArguAna root (default: ARGUANA_ROOT)")
    parser.add_argument("--items", nargs="+", choices=ITEMS, default=list(ITEMS), help="which items to run")
    parser.add_argument("--gpu-only", action="store_true",
                        help="on a CUDA machine: the GPU rows of item 2, the per-step counts (5) and the fine-tuning "
                             "epoch (6); the ablation (7) runs only with --items sweep")
    parser.add_argument("--steps", type=int, default=10, help="timed training steps per row")
    parser.add_argument("--epochs", type=int, default=3, help="timed epochs of items 4 and 6 (after one warm-up)")
    parser.add_argument("--skip-frozen", action="store_true", help="skip item 4 (the frozen real-corpus epoch)")
    parser.add_argument("--jobs", type=int, nargs="+", default=[4, 8],
                        help="item 7: concurrent jobs of the 20-run sweep, one timing per value (CUDA only)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    items = chosen_items(args)
    cpu = torch.device("cpu")
    cuda = torch.device("cuda") if torch.cuda.is_available() else None
    if args.gpu_only and cuda is None:
        print("bench.py: --gpu-only measures the GPU targets, but torch sees no CUDA device (torch.cuda.is_available() "
              f"is False, torch {torch.__version__}); install a CUDA build of torch, or drop --gpu-only for the CPU "
              "items", file=sys.stderr)
        return 2
    print(f"biencoder bench | torch {torch.__version__} | CPU threads {torch.get_num_threads()} | "
          f"GPU {device_label(cuda) if cuda else 'none'}")

    speedup = item_eval(args, cpu, cuda) if "eval" in items else None
    if "train" in items:
        item_train(args, cpu, cuda)
    if "mining" in items:
        item_mining(cpu, cuda)
    if "steps" in items:
        item_steps()
    if "frozen" in items:
        item_frozen(args)
    if "finetune" in items:
        item_finetune(args, cuda)
    if "sweep" in items:
        item_sweep(args, cuda)
    if speedup is not None:
        print(f"\neval_speedup_vs_seed_style: {speedup:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
