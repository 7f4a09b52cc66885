"""Running texts through a :class:`~biencoder.engine.modeling.model.BiModel`: texts tokenised once
(:class:`TokenizedTexts`), pooled vectors and embeddings of every row in eval mode (:func:`encode_pooled`,
:func:`embed_pooled`, :func:`encode`), the one way to get the pooled vectors of some texts, from the embedding cache
or encoded (:func:`pooled_vectors`), and the classifier's margins of pairs of precomputed embeddings
(:func:`pair_margins`). How texts are run (batch size, device, precision, progress bar) is an :class:`Encoding`, made
once per run from its config and :class:`~biencoder.engine.machine.runtime.Runtime`.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from ..config.schema import TrainerSchema
from ..machine.runtime import Runtime, eval_batch_size
from .cache import NonFiniteVectors, encoder_fingerprint, model_cache
from .model import BiModel, Embeddings

log = logging.getLogger("biencoder")

#: without a progress bar (a log file), a long encoding logs how far it got this often
LOG_EVERY_S = 30.0


@dataclass(frozen=True)
class Encoding:
    """How texts run through the encoder: ``batch_size`` texts a forward on ``device`` (None: the device's,
    :func:`~biencoder.engine.machine.runtime.eval_batch_size`; an int once made), under autocast to ``autocast_dtype``
    (None: fp32), with a texts/s progress bar when ``progress``."""

    batch_size: int | None = TrainerSchema.eval_batch_size
    device: str | torch.device = "cpu"
    autocast_dtype: torch.dtype | None = None
    progress: bool = False

    def __post_init__(self):
        object.__setattr__(self, "batch_size", eval_batch_size(torch.device(self.device), self.batch_size))

    @classmethod
    def of_run(cls, trainer: TrainerSchema, runtime: Runtime, progress: bool) -> Encoding:
        """A run's encoding: ``trainer.eval_batch_size`` texts a forward (null: the device's,
        :meth:`Runtime.eval_batch_size`), on the runtime's device and precision."""
        return cls(runtime.eval_batch_size(trainer.eval_batch_size), runtime.device, runtime.autocast_dtype, progress)


@dataclass(frozen=True)
class TextEncoder:
    """What turns texts into pooled vectors (:func:`pooled_vectors`): ``model`` and its ``tokenizer``, texts truncated
    to ``max_length`` tokens, run as ``encoding`` says. ``cache_dir``: the root of the embedding cache (a frozen
    encoder's, whose outputs depend only on its weights) and of the token cache (a run's splits tokenised once:
    :mod:`~biencoder.engine.modeling.token_cache`); None: neither, every text is tokenised and encoded.
    ``fingerprint``: :func:`encoder_fingerprint` of ``model.encoder``, hashed per call when None (give it to hash the
    encoder once for several calls)."""

    model: BiModel
    tokenizer: object
    max_length: int
    encoding: Encoding = Encoding()
    cache_dir: str | Path | None = None
    fingerprint: str | None = None


class TokenizedTexts:
    """Texts tokenised once (truncated to ``max_length``), or their ids read back (:meth:`from_arrays`: what the token
    cache stores); batches are padded on demand.

    ``batch(rows)`` → ``{"input_ids": [B, L], "attention_mask": [B, L], "padded": bool}`` (L = longest row in the
    batch, or ``width`` when given: a static shape; ``padded``: some row is shorter than L, known here on the host:
    :func:`~.model.encoder_mask`).
    """

    #: texts per tokenizer call: a fast tokenizer's output for a call (encodings, offsets, Python lists) is ~20 kB a
    #: text until the call returns, and the allocator keeps it: 200 000 texts at once raised the resident memory by
    #: 3.9 GB for good, blocks of 4096 by 0.2 GB, with the same ids (docs/scaling-data.md)
    CHUNK = 4096

    def __init__(self, texts: list[str], tokenizer, max_length: int):
        texts, self.ids = list(texts), []
        for start in range(0, len(texts), self.CHUNK):
            encoded = tokenizer(texts[start : start + self.CHUNK], truncation=True, max_length=max_length)["input_ids"]
            self.ids += [np.asarray(ids, dtype=np.int64) for ids in encoded]
        self.lengths = np.array([len(ids) for ids in self.ids], dtype=np.int64)
        self.pad_id = tokenizer.pad_token_id or 0

    @classmethod
    def from_arrays(cls, ids: np.ndarray, offsets: np.ndarray, tokenizer) -> TokenizedTexts:
        """The rows :meth:`arrays` returned (row i: ``ids[offsets[i]:offsets[i + 1]]``), padded with ``tokenizer``'s
        pad id: the same :meth:`batch` output as the texts tokenised by ``tokenizer``. The caller checks that
        ``offsets`` [N + 1] starts at 0, never decreases and ends at ``len(ids)``."""
        tokens = cls.__new__(cls)
        flat = np.asarray(ids, dtype=np.int64)
        offsets = np.asarray(offsets, dtype=np.int64)
        tokens.ids = np.split(flat, offsets[1:-1]) if len(offsets) > 1 else []
        tokens.lengths = np.diff(offsets)
        tokens.pad_id = tokenizer.pad_token_id or 0
        return tokens

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(ids [T] int64: every row's ids one after another, offsets [N + 1] int64: row i is
        ``ids[offsets[i]:offsets[i + 1]]``), what :meth:`from_arrays` takes back."""
        offsets = np.zeros(len(self.ids) + 1, dtype=np.int64)
        np.cumsum(self.lengths, out=offsets[1:])
        flat = np.concatenate(self.ids) if self.ids else np.zeros(0, dtype=np.int64)
        return flat.astype(np.int64, copy=False), offsets

    def __len__(self) -> int:
        return len(self.ids)

    def batch(self, rows, width: int | None = None) -> dict[str, Tensor | bool]:
        """The rows ``rows`` padded to ``width`` tokens (None: the longest of them); ValueError when a row is longer
        than ``width``."""
        rows = np.asarray(rows)
        longest = int(self.lengths[rows].max())
        if width is None:
            width = longest
        elif longest > width:
            raise ValueError(f"a row of {longest} tokens does not fit a batch {width} tokens wide")
        input_ids = np.full((len(rows), width), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.int64)
        for i, row in enumerate(rows):
            n = self.lengths[row]
            input_ids[i, :n] = self.ids[row]
            mask[i, :n] = 1
        return {
            "input_ids": torch.from_numpy(input_ids),
            "attention_mask": torch.from_numpy(mask),
            "padded": bool(self.lengths[rows].min() < width),
        }


def to_device(batch: dict, device: torch.device, pin: bool = False) -> dict:
    """``batch``'s tensors copied to ``device`` (non-blocking; pinned first with ``pin``), its other values (the
    host's ``padded``) as they are."""
    return {
        k: (v.pin_memory() if pin else v).to(device, non_blocking=True) if isinstance(v, Tensor) else v
        for k, v in batch.items()
    }


@contextmanager
def eval_mode(model: nn.Module):
    """Eval mode (no dropout) and no gradients inside; the model's previous mode is restored after. A model already in
    eval mode throughout is left alone: no module's mode is set."""
    was_training = model.training
    switch = any(module.training for module in model.modules())
    if switch:
        model.eval()
    try:
        with torch.no_grad():
            yield model
    finally:
        if switch:
            model.train(was_training)


def encode_pooled(
    model: BiModel, texts: TokenizedTexts, encoding: Encoding = Encoding(), desc: str = "encode"
) -> Tensor:
    """Pooled encoder output [N, hidden] (float32, CPU, row order) of every row of ``texts``, in eval mode.

    Rows are processed longest-first, ``encoding.batch_size`` a forward, so each batch pads little. Each batch's
    vectors go to their rows of one float32 tensor on ``encoding.device``, copied to the CPU once at the end: no
    host sync per batch. The batches, and so the vectors, depend on the batch size alone, not on where they are
    kept. The progress bar (``encoding.progress``, labelled ``desc``) counts texts, so it shows texts/s; without it
    (a log file), a log line says how far it got every :data:`LOG_EVERY_S` seconds.
    """
    order = np.argsort(-texts.lengths, kind="stable")
    device, batch_size, dtype = torch.device(encoding.device), encoding.batch_size, encoding.autocast_dtype
    pooled = torch.empty(len(order), model.encoder.config.hidden_size, dtype=torch.float32, device=device)
    rows = torch.from_numpy(order).to(device)
    bar = tqdm(total=len(order), desc=desc, unit="text", disable=not encoding.progress, leave=False)
    began = said = time.monotonic()
    with eval_mode(model), bar:
        for start in range(0, len(order), batch_size):
            batch = to_device(texts.batch(order[start : start + batch_size]), device, pin=device.type == "cuda")
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                vectors = model.pool(**batch)
            pooled[rows[start : start + batch_size]] = vectors.float()
            bar.update(len(batch["input_ids"]))
            if not encoding.progress and time.monotonic() - said >= LOG_EVERY_S:
                said = time.monotonic()
                done = min(start + batch_size, len(order))
                log.info("%s: %d of %d texts encoded (%.0f s)", desc, done, len(order), said - began)
    return pooled.cpu()


def embed_pooled(
    model: BiModel, pooled: Tensor, batch_size: int = 4096, device: str | torch.device = "cpu"
) -> Embeddings:
    """:class:`Embeddings` (float32, CPU) from pooled vectors [N, hidden]: the sim head in eval mode, in blocks."""
    sims = []
    with eval_mode(model):
        for block in pooled.split(batch_size):
            sims.append(model.sim_head(block.to(device)).float().cpu())
    sim = torch.cat(sims) if sims else torch.zeros(0, model.sim_head.out_features)
    return Embeddings(sim, pooled.float().cpu())


def encode(model: BiModel, texts: TokenizedTexts, encoding: Encoding = Encoding(), desc: str = "encode") -> Embeddings:
    """Embed every row of ``texts`` in eval mode → float32 :class:`Embeddings` on the CPU, in row order."""
    pooled = encode_pooled(model, texts, encoding, desc)
    return embed_pooled(model, pooled, device=encoding.device)


def pooled_vectors(encoder: TextEncoder, texts: list[str], desc: str = "encode") -> Tensor:
    """Pooled encoder vectors [N, hidden] (float32, CPU, row order) of ``texts`` by ``encoder``.

    With ``encoder.cache_dir`` they come from the embedding cache there
    (:class:`biencoder.engine.modeling.cache.EmbeddingCache`); the missing texts are encoded (with a texts/s progress
    bar labelled ``desc``) and added to it. Without it every text is encoded. Either way the vectors returned are
    finite, or :class:`~biencoder.engine.modeling.cache.NonFiniteVectors` is raised.
    """
    model, encoding = encoder.model, encoder.encoding

    def encode_rows(rows) -> Tensor:
        tokens = TokenizedTexts([texts[i] for i in rows], encoder.tokenizer, encoder.max_length)
        return encode_pooled(model, tokens, encoding, desc)

    if encoder.cache_dir is None:
        vectors = encode_rows(range(len(texts)))
        if not torch.isfinite(vectors).all():  # as the cache checks what it stores: the vectors returned are finite
            raise NonFiniteVectors()
        return vectors

    def compute(rows: np.ndarray) -> np.ndarray:
        start = time.time()
        pooled = encode_rows(rows).numpy()
        seconds = time.time() - start
        log.info(
            "%s: encoded %d texts in %.1f s (%.1f texts/s)", desc, len(rows), seconds, len(rows) / max(seconds, 1e-9)
        )
        return pooled

    fingerprint = encoder.fingerprint or encoder_fingerprint(model.encoder)
    cache = model_cache(
        model, encoder.tokenizer, encoder.max_length, encoder.cache_dir, fingerprint, encoding.autocast_dtype
    )
    vectors = cache.get(texts, compute)
    log.info("%s: %d of %d texts from the embedding cache %s", desc, cache.hits, len(texts), cache.folder)
    return torch.from_numpy(vectors)


def pair_margins(
    model: BiModel, emb: Embeddings, rows_a, rows_b, batch_size: int = 1024, device: str | torch.device = "cpu"
) -> np.ndarray:
    """Classifier logit margins l1 − l0 [P] (float32) for the pairs (emb[rows_a[i]], emb[rows_b[i]]), in blocks.

    The margin orders pairs exactly as P(positive) = sigmoid(l1 − l0) does, without float32 P's ties: two
    probabilities within 6e-8 of each other, or both saturated at 1.0 (a margin above ~17), become equal and a tie
    counts against the true counter, while their margins still differ. Rankings therefore use margins.

    ``emb`` is precomputed (see :func:`encode`), so the encoder never runs here: one head call per block of
    ``batch_size`` pairs, never one per pair, and never more than a block of features in memory.
    """
    rows_a = torch.as_tensor(np.asarray(rows_a), dtype=torch.long, device=device)
    rows_b = torch.as_tensor(np.asarray(rows_b), dtype=torch.long, device=device)
    emb = emb.to(device)
    out = torch.empty(len(rows_a), dtype=torch.float32, device=device)
    with eval_mode(model), torch.inference_mode():
        score = model.head.pair_scorer(emb, min(batch_size, len(rows_a)))
        for start in range(0, len(rows_a), batch_size):
            stop = start + batch_size
            logits = score(rows_a[start:stop], rows_b[start:stop]).float()
            torch.sub(logits[:, 1], logits[:, 0], out=out[start:stop])
    return out.cpu().numpy()
