"""On-disk cache of frozen-encoder outputs: the pooled vector of every text, computed once.

With ``model.encoder.freeze=true`` the encoder never changes, so the pooled vector of a text depends only on
the encoder's weights, the tokenizer, the pooling, ``max_length`` and the text. Those make the key:

* the **encoder** is identified by a SHA-256 over its parameters and buffers (names, shapes, dtypes, bytes), so a
  hub id, a local folder, a copied folder or a seeded random init are all told apart by what they compute;
* the **tokenizer** by a SHA-256 over what turns text into ids (vocabulary, normalizer, pre-tokenizer, special
  tokens), not over where it was loaded from: equal weights with another vocabulary are another key;
* pooling, ``max_length`` and the precision of the encoder pass name the cache folder together with the hash of
  encoder and tokenizer: ``<cache_dir>/<hash[:16]>-<pooling>-L<max_length>-<precision>/``;
* every text is keyed by the SHA-256 of its UTF-8 bytes.

A folder holds *shards* (``*.npz``: text hashes [N, 32] uint8, vectors [N, H] float32, the folder's meta and a
checksum over all of it). A lookup loads every shard, verifies it and computes only the missing texts, which are
written as one new shard (temp file + rename, so a reader never sees half a shard). A shard that cannot be read,
fails its checksum or carries another key's meta (stale) is reported, deleted and its texts recomputed — never used.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ...errors import BiencoderError
from ..files import strict_json

log = logging.getLogger("biencoder")
FORMAT = 2  # 2: the tokenizer is part of the key


class CacheError(BiencoderError, RuntimeError):
    """The cache folder cannot be used (e.g. not writable); the message says how to fix it."""


class NonFiniteVectors(BiencoderError, FloatingPointError):
    """The encoder gave a NaN or an infinite pooled vector: nothing is cached or returned (one line, exit 2)."""

    def __init__(self):
        super().__init__(
            "the encoder produced non-finite pooled vectors (nothing was cached): check the encoder's "
            "weights (model.encoder.name_or_path), or run with trainer.precision=fp32"
        )


def encoder_fingerprint(encoder: nn.Module) -> str:
    """SHA-256 (hex) over the encoder's state dict: parameter names, shapes, dtypes and values."""
    digest = hashlib.sha256()
    for name, tensor in encoder.state_dict().items():
        tensor = tensor.detach().to("cpu").contiguous()
        digest.update(f"{name}|{tuple(tensor.shape)}|{tensor.dtype}|".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


def tokenizer_fingerprint(tokenizer) -> str:
    """SHA-256 (hex) of what a tokenizer maps text to ids with: class, vocabulary, normalisation, special tokens.

    Fast tokenizers are hashed through their serialised pipeline minus the per-call truncation/padding state; slow
    ones through their vocabulary and special tokens. Paths are never part of it, so a copied folder keeps its key.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        spec = json.loads(backend.to_str())
        spec.pop("truncation", None)
        spec.pop("padding", None)
    else:
        spec = {"vocab": sorted(tokenizer.get_vocab().items())}
    spec["class"] = type(tokenizer).__name__
    spec["special"] = sorted(map(str, tokenizer.all_special_tokens))
    return hashlib.sha256(strict_json(spec, sort_keys=True).encode()).hexdigest()


def text_hashes(texts: list[str]) -> np.ndarray:
    """[N, 32] uint8 SHA-256 digests of the texts' UTF-8 bytes."""
    return np.frombuffer(b"".join(hashlib.sha256(t.encode("utf-8")).digest() for t in texts), dtype=np.uint8).reshape(
        len(texts), 32
    )


def _checksum(hashes: np.ndarray, vectors: np.ndarray, meta: str) -> str:
    digest = hashlib.sha256(meta.encode())
    digest.update(np.ascontiguousarray(hashes).tobytes())
    digest.update(np.ascontiguousarray(vectors).tobytes())
    return digest.hexdigest()


class EmbeddingCache:
    """Pooled vectors of one (encoder, pooling, max_length) under ``cache_dir``.

    Args:
        cache_dir: root of the cache (``trainer.cache_dir``, default ``~/.cache/biencoder``).
        fingerprint: :func:`encoder_fingerprint` of the encoder.
        tokenizer: :func:`tokenizer_fingerprint` of its tokenizer.
        pooling, max_length: as in the model config.
        precision: ``fp32`` or ``bf16``, the dtype the encoder ran in.
    """

    def __init__(
        self,
        cache_dir: str | Path,
        fingerprint: str,
        tokenizer: str,
        pooling: str,
        max_length: int,
        precision: str = "fp32",
    ):
        self.meta = strict_json(
            {
                "format": FORMAT,
                "encoder": fingerprint,
                "tokenizer": tokenizer,
                "pooling": pooling,
                "max_length": int(max_length),
                "precision": precision,
            },
            sort_keys=True,
        )
        key = hashlib.sha256(f"{fingerprint}|{tokenizer}".encode()).hexdigest()
        self.folder = Path(cache_dir).expanduser() / f"{key[:16]}-{pooling}-L{int(max_length)}-{precision}"
        self.hits = self.misses = 0

    def _load_shards(self) -> dict[bytes, np.ndarray]:
        """Text hash → vector from every valid shard; invalid shards are reported and deleted."""
        table: dict[bytes, np.ndarray] = {}
        for shard in sorted(self.folder.glob("*.npz")):
            try:
                with np.load(shard, allow_pickle=False) as data:
                    hashes, vectors = data["hashes"], data["vectors"]
                    meta, checksum = str(data["meta"]), str(data["checksum"])
                problem = None
                if meta != self.meta:
                    problem = "was written for another encoder/tokenizer/pooling/max_length (stale)"
                elif hashes.ndim != 2 or hashes.shape[1] != 32 or len(hashes) != len(vectors):
                    problem = "has inconsistent shapes"
                elif checksum != _checksum(hashes, vectors, meta):
                    problem = "fails its checksum (corrupt)"
                elif not np.isfinite(vectors).all():
                    problem = "holds non-finite vectors"
            except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as err:
                problem = f"cannot be read ({type(err).__name__})"
            if problem:
                log.warning("embedding cache: %s %s; deleting it, its texts will be recomputed", shard, problem)
                shard.unlink(missing_ok=True)
                continue
            for digest, vector in zip(hashes, vectors, strict=True):
                table[digest.tobytes()] = vector
        return table

    def _write_shard(self, hashes: np.ndarray, vectors: np.ndarray) -> Path:
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            name = hashlib.sha256(np.ascontiguousarray(hashes).tobytes()).hexdigest()[:16]
            path = self.folder / f"{time.strftime('%Y%m%d-%H%M%S')}-{name}.npz"
            tmp = self.folder / f".{path.name}.{os.getpid()}.tmp"
            with open(tmp, "wb") as file:
                np.savez(
                    file,
                    hashes=hashes,
                    vectors=vectors,
                    meta=np.array(self.meta),
                    checksum=np.array(_checksum(hashes, vectors, self.meta)),
                )
                file.flush()
                os.fsync(file.fileno())
            os.replace(tmp, path)
        except OSError as err:
            raise CacheError(
                f"cannot write the embedding cache in {self.folder} ({err.strerror}): "
                "set trainer.cache_dir to a writable folder"
            ) from None
        return path

    def missing(self, texts: list[str]) -> int:
        """How many distinct texts of ``texts`` the cache lacks (:meth:`get` would compute them)."""
        table = self._load_shards()
        return len({h.tobytes() for h in text_hashes(texts)} - table.keys())

    def get(self, texts: list[str], compute: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        """Vectors [N, H] float32 for ``texts``; ``compute(rows)`` embeds the rows missing from the cache."""
        hashes = text_hashes(texts)
        table = self._load_shards()
        missing = np.array([i for i, h in enumerate(hashes) if h.tobytes() not in table], dtype=np.int64)
        # a text listed twice is computed once
        unique_missing = np.array(sorted({hashes[i].tobytes(): i for i in missing[::-1]}.values()), dtype=np.int64)
        self.hits, self.misses = len(texts) - len(missing), len(unique_missing)
        if len(unique_missing):
            vectors = np.ascontiguousarray(compute(unique_missing), dtype=np.float32)
            if not np.isfinite(vectors).all():
                raise NonFiniteVectors()
            self._write_shard(hashes[unique_missing], vectors)
            for i, vector in zip(unique_missing, vectors, strict=True):
                table[hashes[i].tobytes()] = vector
        return np.stack([table[h.tobytes()] for h in hashes]) if len(texts) else np.zeros((0, 0), np.float32)


def model_cache(
    model,
    tokenizer,
    max_length: int,
    cache_dir: str | Path,
    fingerprint: str,
    autocast_dtype: torch.dtype | None = None,
) -> EmbeddingCache:
    """The :class:`EmbeddingCache` that :func:`biencoder.engine.modeling.encoding.pooled_vectors` reads and fills for
    ``model`` (a BiModel) run with ``autocast_dtype`` (None: fp32)."""
    precision = "bf16" if autocast_dtype == torch.bfloat16 else "fp32"
    return EmbeddingCache(
        cache_dir, fingerprint, tokenizer_fingerprint(tokenizer), model.pooling, max_length, precision
    )
