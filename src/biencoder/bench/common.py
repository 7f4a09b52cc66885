"""What the benchmark items share: the devices, a best-of timer and a phase timer, the random-init encoders, the MFU
estimator, the profiler's operator and host-sync counter, the seed scripts' evaluator, the corpus check and the
config composition of a run."""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

from biencoder.engine.config.heads import head_spec
from biencoder.engine.data.arguana import ARGUANA_ROOT_ENV, CorpusError, arguana_root, resolve_root
from biencoder.engine.modeling.model import BiModel, Embeddings
from biencoder.engine.retrieval.search import NeighbourIndex

#: the folder that holds the ``biencoder`` package (``src/`` in a checkout): the sweep's subprocesses import from it
SRC = Path(__file__).resolve().parents[2]
#: ``--corpus``'s default: where data=arguana reads the corpus (``ARGUANA_ROOT``, else data/arguana-counterargs-corpus)
DEFAULT_CORPUS = arguana_root()
#: dense bf16 peak (TFLOP/s, no sparsity) of GPUs this was run on; others print MFU as n/a
PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L4": 121.0, "A10": 125.0}


@dataclass(frozen=True)
class Devices:
    """The devices a bench run measures on: always the CPU, and the first CUDA device when torch sees one."""

    cpu: torch.device
    cuda: torch.device | None

    @classmethod
    def detect(cls) -> Devices:
        return cls(torch.device("cpu"), torch.device("cuda") if torch.cuda.is_available() else None)

    def all(self) -> list[torch.device]:
        return [self.cpu] + ([self.cuda] if self.cuda is not None else [])


def device_label(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({torch.get_num_threads()} threads)"


def _sync(device: torch.device | None) -> None:
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, repeat: int = 1, sync: torch.device | None = None) -> tuple[float, object]:
    """Best-of-``repeat`` wall seconds of ``fn()`` and its last result (``sync``: a CUDA device is synchronised
    around each call, so the device's work is inside the time)."""
    best, out = math.inf, None
    for _ in range(repeat):
        _sync(sync)
        start = time.perf_counter()
        out = fn()
        _sync(sync)
        best = min(best, time.perf_counter() - start)
    return best, out


class PhaseTimer:
    """Wall and process CPU seconds summed per phase name; on CUDA the device is synchronised around each phase."""

    def __init__(self, device: torch.device):
        self.device, self.wall, self.cpu = device, {}, {}

    def __call__(self, name: str, fn):
        _sync(self.device)
        begin, begin_cpu = time.perf_counter(), time.process_time()
        result = fn()
        _sync(self.device)
        self.add(name, time.perf_counter() - begin, time.process_time() - begin_cpu)
        return result

    def add(self, name: str, wall: float, cpu: float) -> None:
        self.wall[name] = self.wall.get(name, 0.0) + wall
        self.cpu[name] = self.cpu.get(name, 0.0) + cpu


# -- random-init encoders and their FLOPs ---------------------------------------------------------------------------
def bert_sizes() -> dict[str, dict[str, int]]:
    """Layers and widths of the random-init BERT encoders benchmarked here."""
    return {
        "tiny": dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64),
        "minilm": dict(num_hidden_layers=6, hidden_size=384, num_attention_heads=12, intermediate_size=1536),
        "bert-base": dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12, intermediate_size=3072),
    }


def bert_config(kind: str):
    from transformers import BertConfig

    return BertConfig(vocab_size=30522, max_position_embeddings=512, **bert_sizes()[kind])


def random_model(kind: str, device: torch.device) -> BiModel:
    """A :class:`BiModel` (mean pooling, LayerNorm and ReLU in the pair head) over a random-init BERT of ``kind``."""
    from transformers import BertModel

    torch.manual_seed(0)
    head = head_spec({"use_layernorm": True, "use_relu": True})
    return BiModel(BertModel(bert_config(kind)), pooling="mean", head=head).to(device)


def train_flops_per_step(config, batch_seqs: int, seq_len: int) -> float:
    """Forward+backward FLOPs of one step: 6·N·tokens for the matmul weights (N without embeddings) plus
    attention scores and values, 12·layers·seq²·hidden per sequence (forward 4·…, backward twice that)."""
    h, layers, inter = config.hidden_size, config.num_hidden_layers, config.intermediate_size
    weights = layers * (4 * h * h + 2 * h * inter)
    return 6 * weights * batch_seqs * seq_len + 12 * layers * seq_len * seq_len * h * batch_seqs


def mfu(flops_per_s: float, device: torch.device, dtype) -> float | None:
    """Model FLOPs utilisation: ``flops_per_s`` over the device's dense bf16 peak (:data:`PEAK_BF16_TFLOPS`); None
    on a CPU, for another precision than bf16, or for a GPU whose peak is not listed."""
    if device.type != "cuda" or dtype != torch.bfloat16:
        return None
    peak = next((v for k, v in PEAK_BF16_TFLOPS.items() if k in device_label(device)), None)
    return None if peak is None else flops_per_s / (peak * 1e12)


# -- operator calls and host synchronisations per step ---------------------------------------------------------------
#: ops whose result is read by the host: .item(), bool(t), float(t), int(t) (aten::is_nonzero calls item)
SYNC_OPS = ("aten::_local_scalar_dense",)
#: CUDA runtime calls that block the host until the device is done
CUDA_SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")
#: Tensor methods that read data into Python without dispatching an op on a CPU tensor (on CUDA they copy and sync)
HOST_READS = ("tolist", "numpy")
#: fused AdamW's kernels: on a CPU they read each parameter's step counter, a CPU tensor (one read per parameter)
OPTIMIZER_KERNELS = ("aten::_fused_adamw_", "aten::_fused_adam_")


class HostReads(TorchFunctionMode):
    """Counts the :data:`HOST_READS` calls made while it is active, by ``Tensor.<name>``, into :attr:`reads`."""

    def __init__(self):
        super().__init__()
        self.reads: dict[str, int] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in HOST_READS:
            self.reads[f"Tensor.{name}"] = self.reads.get(f"Tensor.{name}", 0) + 1
        return func(*args, **(kwargs or {}))


def _inside(event, names) -> bool:
    """Whether a profiler event runs inside (is called by) an op named in ``names``."""
    parent = event.cpu_parent
    while parent is not None and parent.name not in names:
        parent = parent.cpu_parent
    return parent is not None


def _tally(events, device: torch.device) -> tuple[int, dict[str, int], int]:
    """(aten:: calls, synchronising events by name, exempt events) of one profiled window's ``events``. Exempt: on a
    CPU the reads inside fused AdamW's kernel of its CPU step counters; on CUDA the one ``cudaDeviceSynchronize`` of
    the profiler's own exit (``torch.autograd.profiler.profile.__exit__`` synchronises the device while it still
    records: one per window, whatever the number of steps in it)."""
    ops, named, exempt = 0, {}, 0
    for event in events:
        ops += event.name.startswith("aten::")
        if event.name in (CUDA_SYNCS if device.type == "cuda" else SYNC_OPS):
            if device.type == "cpu" and _inside(event, OPTIMIZER_KERNELS):
                exempt += 1
            else:
                named[event.name] = named.get(event.name, 0) + 1
    if device.type == "cuda" and named.get("cudaDeviceSynchronize", 0) > 0:
        named["cudaDeviceSynchronize"] -= 1
        exempt += 1
        named = {name: count for name, count in named.items() if count}
    return ops, named, exempt


def count_step(step, device: torch.device, steps: int, warmup: int = 2) -> dict:
    """Profile ``steps`` calls of ``step()`` (after ``warmup`` calls: enough for a graphed step to have captured its
    graphs); per step: ``ops`` (aten:: calls, nested ones
    included), ``syncs`` (host synchronisations: on CUDA the runtime's synchronising calls, copies to the CPU
    included (``cudaMemcpy``); on a CPU the host reads of tensor values, :data:`SYNC_OPS` plus Tensor.tolist()/numpy(),
    caught by :class:`HostReads` since a CPU tensor's tolist() dispatches no op) with the names behind them
    (``sync_names``), ``exempt``: the reads inside fused AdamW's kernel (:data:`OPTIMIZER_KERNELS`) on a CPU, of its
    step counters, which are CPU tensors there: they wait for no device, so they are not counted as syncs (on CUDA:
    the profiler's own synchronisation at its exit, see :func:`_tally`); and ``ms``,
    the wall milliseconds of a step without the profiler."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warmup):
        step()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof, HostReads() as host:
        for _ in range(steps):
            step()
    _sync(device)
    ops, named, exempt = _tally(prof.events(), device)
    if device.type != "cuda":
        named.update(host.reads)
    seconds, _ = timed(lambda: [step() for _ in range(steps)], sync=device)
    return {
        "ops": ops / steps,
        "syncs": sum(named.values()) / steps,
        "exempt": exempt / steps,
        "sync_names": {k: v / steps for k, v in sorted(named.items())},
        "ms": 1000 * seconds / steps,
    }


# -- the seed scripts' evaluator --------------------------------------------------------------------------------------
def seed_style_top1(model: BiModel, emb: Embeddings, split, k: int, device: torch.device) -> float:
    """The seed scripts' evaluator, made correct (same pool as ours) but kept at its speed: per query a BallTree
    query, then per candidate one classifier call on one pair, with the vectors copied host→device each time."""
    sim, pooled = emb.sim.numpy(), emb.pooled.numpy()
    tree = NeighbourIndex(sim, "balltree")
    extra = 1 + int(split.twins_of_true_counter().max())

    def to_device(row: int) -> Embeddings:
        one = slice(row, row + 1)
        return Embeddings(torch.from_numpy(sim[one]).to(device), torch.from_numpy(pooled[one]).to(device))

    hits = 0
    model.eval()
    with torch.no_grad():
        for q, true_counter in zip(split.query, split.counter, strict=True):
            _, rows = tree.query(sim[q : q + 1], k + extra)
            rows = np.array(
                [
                    r
                    for r in rows[0]
                    if r != q
                    and not (  # the pool rule, one candidate at a time
                        split.is_counter[r] and split.text_id[r] == split.text_id[true_counter] and r != true_counter
                    )
                ][:k]
            )
            scores = []
            for row in rows:
                logits = model.head.classify_pair(to_device(q), to_device(row))[0]
                scores.append((logits[1] - logits[0]).item())  # ranked by logit margin, as ours
            scores = np.array(scores)
            is_true = rows == true_counter
            hits += bool(is_true.any() and (scores[~is_true] < scores[is_true][0]).all())
    return hits / len(split.query)


# -- the corpus and the run's config --------------------------------------------------------------------------------
def is_corpus(root: Path) -> bool:
    """Whether ``root`` holds the ArguAna layout, as the reader decides it (:func:`resolve_root`)."""
    try:
        resolve_root(root)
    except CorpusError:
        return False
    return True


def corpus_found(root: Path) -> bool:
    """Whether the real corpus is at ``root``: if so, the runs of items 4, 6 (CUDA) and 7 read it (``ARGUANA_ROOT``);
    if not, the item says it is skipped and why."""
    if not is_corpus(root):
        print(f"   skipped (no ArguAna corpus at {root}; set ARGUANA_ROOT or pass --corpus)")
        return False
    os.environ[ARGUANA_ROOT_ENV] = str(root)
    return True


def compose_config(overrides: list[str]):
    """The real configs of ``conf/`` composed with ``overrides`` (:func:`biencoder.hydra_glue.compose_config`) and
    validated, as a run's are (Hydra is imported here, not at module level: importing the bench loads no Hydra)."""
    from biencoder.engine.config.validation import validate
    from biencoder.hydra_glue import compose_config as compose

    cfg = compose(overrides)
    validate(cfg)
    return cfg
