"""sentence-transformers' own training as a peer of ours (bench item 8, :mod:`biencoder.bench.peer`): the trainer
(``SentenceTransformerTrainer``, ``MultipleNegativesRankingLoss``) on given triplets in their order, steady-state
triplets/s; where it cannot be imported, built or run (the GPU image may lack ``datasets`` or ``accelerate``), the
same model and loss in a plain loop, and the result says why. sentence-transformers, datasets and transformers are
imported inside the functions: importing the bench needs none of them."""

from __future__ import annotations

import gc
import importlib.metadata
import shutil
import tempfile
import time
from dataclasses import dataclass

import torch

from biencoder.bench.common import device_label

#: the packages whose versions say what ran
PACKAGES = ("sentence-transformers", "transformers", "datasets", "accelerate", "torch")
TRAINER = "SentenceTransformerTrainer"
OWN_LOOP = "sentence-transformers model+loss, own loop"


@dataclass(frozen=True)
class PeerSettings:
    """What the peer trains: ``steps`` timed steps after ``warmup`` untimed ones (at least 1: the clock starts at the
    end of the last warm-up step), ``batch_size`` triplets of at most ``max_seq_length`` tokens, bf16 autocast."""

    steps: int = 100
    warmup: int = 10
    batch_size: int = 16
    max_seq_length: int = 128
    bf16: bool = True

    def __post_init__(self):
        if self.steps < 1 or self.warmup < 1:
            raise ValueError(f"the peer needs steps >= 1 and warmup >= 1, got {self.steps} and {self.warmup}")

    def describe(self) -> str:
        return (
            f"{self.steps} steps after {self.warmup}, {self.batch_size} triplets x {self.max_seq_length} tok, "
            f"{'bf16' if self.bf16 else 'fp32'}"
        )


@dataclass(frozen=True)
class PeerResult:
    """Steady-state ``triplets_s`` of the peer and what ran: ``path`` (:data:`TRAINER` or :data:`OWN_LOOP`),
    ``reason`` (why the trainer did not run; None when it did), the package ``versions`` (None: not installed)."""

    triplets_s: float
    path: str
    reason: str | None
    versions: dict[str, str | None]
    settings: PeerSettings
    device: str

    def label(self) -> str:
        """What ran, in one line: the path (with the reason for the own loop), packages, settings, device."""
        path = self.path if self.reason is None else f"{self.path} (trainer unavailable: {self.reason})"
        packages = ", ".join(f"{name} {version or '-'}" for name, version in self.versions.items())
        return f"{path}; {packages}; {self.settings.describe()}; {self.device}"


def one_line(error: BaseException, limit: int = 200) -> str:
    """``error`` as ``Type: message``, its first line, at most ``limit`` characters."""
    text = f"{type(error).__name__}: {error}".splitlines()[0]
    return text if len(text) <= limit else text[: limit - 3] + "..."


def versions() -> dict[str, str | None]:
    """The installed version of each of :data:`PACKAGES`; None for one that is not installed."""
    return {name: _version(name) for name in PACKAGES}


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


class StepClock:
    """Wall seconds from the end of step ``warmup`` to the end of step ``warmup + steps`` (counts of finished steps,
    from 1); on CUDA the device is synchronised at both ends, so the timed steps' device work is inside the time."""

    def __init__(self, device: torch.device, settings: PeerSettings):
        self.device, self.first, self.last = device, settings.warmup, settings.warmup + settings.steps
        self.start: float | None = None
        self.end: float | None = None

    def step_ended(self, step: int) -> None:
        if step not in (self.first, self.last):
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        if step == self.first:
            self.start = time.perf_counter()
        else:
            self.end = time.perf_counter()

    def seconds(self) -> float:
        if self.start is None or self.end is None:
            raise RuntimeError(f"the peer stopped before step {self.last}: no steady-state time")
        return self.end - self.start


def peer_batches(triplets: list[tuple[str, str, str]], settings: PeerSettings) -> list[list[tuple[str, str, str]]]:
    """The ``warmup + steps`` batches both paths train on: ``batch_size`` consecutive triplets each, a last partial
    batch dropped, from the first again when the list runs out (as the trainer's next epoch does, in order)."""
    size = settings.batch_size
    full = len(triplets) // size
    if full == 0:
        raise ValueError(f"{len(triplets)} triplets make no batch of {size}")
    return [triplets[(i % full) * size : (i % full + 1) * size] for i in range(settings.warmup + settings.steps)]


def _st_model(model_path: str, device: torch.device, settings: PeerSettings):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(model_path, device=str(device))
    model.max_seq_length = settings.max_seq_length
    return model


def _mnrl(model):
    """``MultipleNegativesRankingLoss`` of ``model``: (anchor, positive, negative) columns, in-batch negatives too."""
    try:
        from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss  # 6.x
    except ImportError:
        from sentence_transformers.losses import MultipleNegativesRankingLoss  # 3.x to 5.x
    return MultipleNegativesRankingLoss(model)


def _trainer_arguments(out: str, device: torch.device, settings: PeerSettings):
    """The trainer's arguments: our step's work and no more (fused AdamW, no gradient clipping, a constant rate:
    ours clips nothing), no logging, saving or evaluation, batches assembled in this process as ours are. The
    learning rate does not change a step's work: the library's default."""
    from sentence_transformers import SentenceTransformerTrainingArguments

    return SentenceTransformerTrainingArguments(
        output_dir=out,
        per_device_train_batch_size=settings.batch_size,
        max_steps=settings.warmup + settings.steps,
        bf16=settings.bf16,
        use_cpu=device.type == "cpu",
        optim="adamw_torch_fused",
        max_grad_norm=0.0,
        lr_scheduler_type="constant",
        logging_strategy="no",
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        dataloader_drop_last=True,
        seed=0,
    )


def _trainer_seconds(batches, model_path: str, device: torch.device, settings: PeerSettings) -> float:
    """Steady-state seconds of ``settings.steps`` steps of ``SentenceTransformerTrainer`` on ``batches`` in their
    order (a sequential batch sampler: the trainer would shuffle), timed by a callback at each step's end."""
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainer
    from torch.utils.data import BatchSampler, SequentialSampler
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    clock = StepClock(device, settings)

    class Clocked(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            clock.step_ended(state.global_step)

    class InOrder(BatchSampler):
        def set_epoch(self, epoch: int) -> None:  # the trainer sets it each epoch; the order stays
            pass

    class InOrderTrainer(SentenceTransformerTrainer):
        def get_batch_sampler(self, dataset, batch_size, drop_last, *args, **kwargs):
            return InOrder(SequentialSampler(dataset), batch_size, drop_last)

    triplets = [t for batch in batches for t in batch]  # a row per triplet of each batch, in order
    model = _st_model(model_path, device, settings)
    columns = dict(zip(("anchor", "positive", "negative"), map(list, zip(*triplets, strict=True)), strict=True))
    out = tempfile.mkdtemp(prefix="bench-peer-trainer-")
    try:
        trainer = InOrderTrainer(
            model=model,
            args=_trainer_arguments(out, device, settings),
            train_dataset=Dataset.from_dict(columns),
            loss=_mnrl(model),
            callbacks=[Clocked()],
        )
        for printer in (PrinterCallback, ProgressCallback):  # the bench prints one line; the trainer would add a dict
            trainer.remove_callback(printer)
        trainer.train()
    finally:
        shutil.rmtree(out, ignore_errors=True)  # the temporary folder this function made
    return clock.seconds()


def _own_loop_seconds(batches, model_path: str, device: torch.device, settings: PeerSettings) -> float:
    """Steady-state seconds of ``settings.steps`` steps of the trainer's work without the trainer: the same model and
    loss on ``batches``, each column tokenised per batch as the trainer's collator does, fused AdamW, bf16 autocast."""
    model = _st_model(model_path, device, settings)
    loss = _mnrl(model)
    tokenise = getattr(model, "preprocess", None) or model.tokenize  # 6.x renamed tokenize
    optimizer = torch.optim.AdamW(model.parameters(), fused=True)
    clock = StepClock(device, settings)
    model.train()
    for step, batch in enumerate(batches, start=1):
        features = [
            {k: v.to(device) if torch.is_tensor(v) else v for k, v in tokenise(list(column)).items()}
            for column in zip(*batch, strict=True)
        ]
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=settings.bf16):
            value = loss(features, None)
        optimizer.zero_grad(set_to_none=False)
        value.backward()
        optimizer.step()
        clock.step_ended(step)
    return clock.seconds()


def bench_sentence_transformers(
    triplets: list[tuple[str, str, str]], model_path: str, device: torch.device, settings: PeerSettings | None = None
) -> PeerResult:
    """Steady-state triplets/s of sentence-transformers training ``model_path`` (a SentenceTransformer folder) with
    ``MultipleNegativesRankingLoss`` on ``triplets`` (point, counter, negative) in their order, on ``device``: through
    ``SentenceTransformerTrainer``, else (it cannot be imported, built or run) through :func:`_own_loop_seconds`,
    the result saying why. ``settings``: :class:`PeerSettings` (None: its defaults, the bench's). Raises what the own
    loop raises (sentence-transformers missing, a bad model folder)."""
    settings = PeerSettings() if settings is None else settings
    batches = peer_batches(triplets, settings)
    path, reason = TRAINER, None
    try:
        seconds = _trainer_seconds(batches, model_path, device, settings)
    except Exception as error:  # the GPU image may lack datasets or accelerate; anything else is said too
        path, reason = OWN_LOOP, one_line(error)
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        seconds = _own_loop_seconds(batches, model_path, device, settings)
    rate = settings.steps * settings.batch_size / seconds
    return PeerResult(rate, path, reason, versions(), settings, device_label(device))
