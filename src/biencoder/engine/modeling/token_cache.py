"""On-disk cache of token ids: a list of texts tokenised once, read back by every run that tokenises it the same way.

The ids of a text depend on the tokenizer, ``max_length`` and the text. Those make the key:

* the **tokenizer** by :func:`~biencoder.engine.modeling.cache.tokenizer_fingerprint` (class, vocabulary,
  normalisation, special tokens; never its path), the side it truncates, whether it splits special tokens written in
  the text, and the versions of ``tokenizers`` and ``transformers`` that ran it;
* ``max_length``;
* the **texts** by a SHA-256 over the SHA-256 of each text's UTF-8 bytes, in order, and their count.

An entry is one file, ``<cache_dir>/tokens/<key hash[:32]>-L<max_length>.npz``: every row's ids one after another
(int32 where they fit, else int64), the offsets [N + 1] int64 where each row starts, the key itself (``meta``) and a
SHA-256 over all three. It is written to a temporary file and renamed, so a reader never sees half an entry; runs that
start at once and write the same entry write the same bytes, and the last rename wins. A file that cannot be read,
fails its checksum, has offsets that cannot be a tokenisation to ``max_length`` of those texts, or carries another key
is reported, deleted and the texts tokenised again: never used. A cache folder that cannot be written costs only the
cache (a warning; the run goes on with the ids it tokenised).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import time
import zipfile
from pathlib import Path

import numpy as np
import tokenizers
import transformers

from ..files import strict_json
from .cache import text_hashes, tokenizer_fingerprint
from .encoding import TokenizedTexts

log = logging.getLogger("biencoder")
FORMAT = 1
_INT32 = np.iinfo(np.int32)


def _checksum(ids: np.ndarray, offsets: np.ndarray, meta: str) -> str:
    digest = hashlib.sha256(meta.encode())
    digest.update(np.ascontiguousarray(ids).tobytes())
    digest.update(np.ascontiguousarray(offsets).tobytes())
    return digest.hexdigest()


class TokenCache:
    """The token ids of texts tokenised by ``tokenizer`` to ``max_length`` tokens, under ``cache_dir/tokens``.

    Args:
        cache_dir: root of the cache (``trainer.cache_dir``; the embedding cache's root too).
        tokenizer: a Hugging Face tokenizer, called as :class:`TokenizedTexts` calls it.
        max_length: tokens kept of each text (``model.max_length``).
    """

    def __init__(self, cache_dir: str | Path, tokenizer, max_length: int):
        self.folder = Path(cache_dir).expanduser() / "tokens"
        self.tokenizer, self.max_length = tokenizer, int(max_length)
        self.identity = {
            "format": FORMAT,
            "tokenizer": tokenizer_fingerprint(tokenizer),
            "truncation_side": str(getattr(tokenizer, "truncation_side", "right")),
            "split_special_tokens": bool(getattr(tokenizer, "split_special_tokens", False)),
            "tokenizers": tokenizers.__version__,
            "transformers": transformers.__version__,
            "max_length": self.max_length,
        }

    def meta(self, texts: list[str]) -> str:
        """The key of ``texts`` (a JSON object): the tokenizer's identity, ``max_length`` and the texts' digest."""
        digest = hashlib.sha256(np.ascontiguousarray(text_hashes(texts)).tobytes()).hexdigest()
        return strict_json({**self.identity, "texts": digest, "count": len(texts)}, sort_keys=True)

    def path(self, meta: str) -> Path:
        """The file of the entry keyed ``meta``."""
        return self.folder / f"{hashlib.sha256(meta.encode()).hexdigest()[:32]}-L{self.max_length}.npz"

    def tokenized(self, texts: list[str], desc: str = "tokens") -> tuple[TokenizedTexts, bool]:
        """(``texts`` tokenised, whether the ids came from the cache): read from it when it holds them, else tokenised
        and stored. Either way the ids and lengths are those of ``TokenizedTexts(texts, tokenizer, max_length)``. One
        log line, labelled ``desc``, says which."""
        texts = list(texts)
        meta = self.meta(texts)
        path = self.path(meta)
        tokens = self._read(path, meta, len(texts))
        if tokens is not None:
            log.info("%s: token ids of %d texts read from the token cache %s", desc, len(texts), path)
            return tokens, True
        start = time.perf_counter()
        tokens = TokenizedTexts(texts, self.tokenizer, self.max_length)
        seconds = time.perf_counter() - start
        stored = "stored in" if self._write(path, meta, tokens) else "not stored (see above) in"
        log.info("%s: %d texts tokenised in %.1f s, %s the token cache %s", desc, len(texts), seconds, stored, path)
        return tokens, False

    def _problem(self, ids: np.ndarray, offsets: np.ndarray, meta: str, stored: str, count: int) -> str | None:
        """Why an entry read from disk cannot be the tokenisation keyed ``meta`` of ``count`` texts, or None."""
        if stored != meta:
            return "carries another key"
        if ids.ndim != 1 or ids.dtype not in (np.int32, np.int64) or offsets.ndim != 1 or offsets.dtype != np.int64:
            return "has arrays of the wrong shape or type"
        if len(offsets) != count + 1 or offsets[0] != 0 or offsets[-1] != len(ids):
            return "has offsets that do not cover its ids"
        lengths = np.diff(offsets)
        if len(lengths) and (lengths.min() < 0 or lengths.max() > self.max_length):
            return f"has rows of a negative length or longer than {self.max_length} tokens"
        return None

    def _read(self, path: Path, meta: str, count: int) -> TokenizedTexts | None:
        """The entry at ``path`` as TokenizedTexts, or None: absent, or invalid (then reported and deleted)."""
        if not path.is_file():
            return None
        try:
            with np.load(path, allow_pickle=False) as data:
                ids, offsets = data["ids"], data["offsets"]
                stored, checksum = str(data["meta"]), str(data["checksum"])
            problem = self._problem(ids, offsets, meta, stored, count)
            if problem is None and checksum != _checksum(ids, offsets, stored):
                problem = "fails its checksum (corrupt)"
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as err:
            problem = f"cannot be read ({type(err).__name__})"
        if problem is None:
            return TokenizedTexts.from_arrays(ids, offsets, self.tokenizer)
        log.warning("token cache: %s %s; deleting it, the texts will be tokenised again", path, problem)
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)
        return None

    def _write(self, path: Path, meta: str, tokens: TokenizedTexts) -> bool:
        """Store ``tokens`` at ``path`` (temp file + rename); False, with a warning, where the folder is read-only."""
        ids, offsets = tokens.arrays()
        if not len(ids) or (ids.min() >= _INT32.min and ids.max() <= _INT32.max):
            ids = ids.astype(np.int32)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as file:
                checksum = np.array(_checksum(ids, offsets, meta))
                np.savez(file, ids=ids, offsets=offsets, meta=np.array(meta), checksum=checksum)
                file.flush()
                os.fsync(file.fileno())
            os.replace(tmp, path)
        except OSError as err:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            log.warning(
                "token cache: cannot write %s (%s); the run goes on without it: set trainer.cache_dir to a writable "
                "folder to tokenise each corpus once",
                path,
                err.strerror,
            )
            return False
        return True
