"""The ArguAna counterargs corpus on disk (Wachsmuth, Syed & Stein, ACL 2018): where the splits are and how a split
folder reads into one row per argument file. :mod:`.corpus` builds the tables, pairs and splits from these rows.

Layout (``02-extracted-arguments``)::

    training|validation|test/<theme>/<debate>/{thesis.txt, metadata.txt, pro/, con/}
    pro/pro01a-point.txt   pro/pro01b-counter.txt   con/con03a-point.txt ...

Stray files are ignored with a :class:`CorpusWarning` (dot-files silently); what cannot be read as this layout is a
:class:`CorpusError` whose message says what to fix.
"""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path

from ...errors import BiencoderError

#: where the real corpus is when no config or option says: ``$ARGUANA_ROOT``, else this folder (relative to the
#: working directory); the one definition, read by data=arguana (``${arguana_root:}``), the tests and the bench
ARGUANA_ROOT_ENV = "ARGUANA_ROOT"
DEFAULT_ARGUANA_ROOT = "data/arguana-counterargs-corpus"
#: the corpus's split folders, in order
SPLITS = ("training", "validation", "test")
EXTRACTED = "02-extracted-arguments"
STANCES = ("pro", "con")
DEBATE_FILES = {"thesis.txt", "metadata.txt"}
_ARG_FILE = re.compile(r"^(?P<stance>pro|con)(?P<number>\d+)(?:a-(?P<point>point)|b-(?P<counter>counter))\.txt$")


class CorpusError(BiencoderError, ValueError):
    """The corpus on disk cannot be read as the ArguAna counterargs layout; the message says what to fix."""


class CorpusWarning(UserWarning):
    """A stray file in the corpus that is ignored."""


def arguana_root() -> Path:
    """The real corpus's default folder: ``$ARGUANA_ROOT``, else ``data/arguana-counterargs-corpus``."""
    return Path(os.environ.get(ARGUANA_ROOT_ENV, DEFAULT_ARGUANA_ROOT))


def resolve_root(root: str | Path) -> Path:
    """Return the folder holding the three split folders.

    Accepts the corpus root (which holds ``02-extracted-arguments``) or that folder itself.
    Raises :class:`CorpusError` when the path does not exist or holds no split folders.
    """
    path = Path(root).expanduser()
    if not path.exists():
        raise CorpusError(
            f"corpus root '{root}' does not exist: pass the folder that holds {EXTRACTED}/ "
            "(or set data.root / ARGUANA_ROOT to it)"
        )
    if not path.is_dir():
        raise CorpusError(f"corpus root '{root}' is not a folder: pass the folder that holds {EXTRACTED}/")
    if (path / EXTRACTED).is_dir():
        path = path / EXTRACTED
    missing = [s for s in SPLITS if not (path / s).is_dir()]
    if missing:
        raise CorpusError(
            f"corpus root '{root}' has no split folder(s) {', '.join(missing)}: expected "
            f"{'/'.join(SPLITS)}/ inside it or inside its {EXTRACTED}/"
        )
    return path


def _ignored(entry: Path, expected: str) -> None:
    # macOS litter is common in hand-copied corpora and not worth a warning.
    if not entry.name.startswith("."):
        warnings.warn(f"ignoring {entry} (expected {expected})", CorpusWarning, stacklevel=3)


def _read_text(path: Path) -> str:
    try:
        text = path.read_bytes().decode("utf-8").strip()
    except UnicodeDecodeError as err:
        raise CorpusError(f"{path} is not UTF-8 ({err.reason} at byte {err.start}): re-save it as UTF-8") from None
    if not text:
        raise CorpusError(f"{path} is empty: an argument file needs at least a conclusion line")
    return text


def _subdirs(folder: Path, expected: str) -> list[Path]:
    out = []
    for entry in sorted(folder.iterdir()):
        if entry.is_dir():
            out.append(entry)
        else:
            _ignored(entry, expected)
    return out


def _debate_url(debate: Path) -> str | None:
    """The ``url`` line of a debate's metadata.txt (tab-separated key/value lines), or None."""
    try:
        for line in (debate / "metadata.txt").read_text(encoding="utf-8", errors="replace").splitlines():
            key, _, value = line.partition("\t")
            if key.strip() == "url" and value.strip():
                return value.strip()
    except OSError:
        pass
    return None


def read_split(folder: Path, split: str) -> tuple[list[dict], int, list[dict]]:
    """Rows of every argument file of one split; also the number of themes and one row per debate (with its URL)."""
    rows: list[dict] = []
    themes = _subdirs(folder, "a theme folder")
    debates: list[dict] = []
    for theme in themes:
        for debate in _subdirs(theme, "a debate folder"):
            debates.append({"split": split, "theme": theme.name, "debate": debate.name, "url": _debate_url(debate)})
            for entry in sorted(debate.iterdir()):
                if entry.is_dir() and entry.name in STANCES:
                    rows.extend(_read_side(entry, split, theme.name, debate.name))
                elif entry.name not in DEBATE_FILES:
                    _ignored(entry, "thesis.txt, metadata.txt, pro/ or con/")
    return rows, len(themes), debates


def _read_side(side: Path, split: str, theme: str, debate: str) -> list[dict]:
    rows = []
    for entry in sorted(side.iterdir()):
        match = _ARG_FILE.match(entry.name)
        if not entry.is_file() or match is None or match["stance"] != side.name:
            _ignored(entry, f"{side.name}NNa-point.txt or {side.name}NNb-counter.txt")
            continue
        text = _read_text(entry)
        conclusion, _, premise = text.partition("\n")
        rows.append(
            {
                "split": split,
                "theme": theme,
                "debate": debate,
                "stance": side.name,
                "number": int(match["number"]),
                "kind": "point" if match["point"] else "counter",
                "conclusion": conclusion.strip(),
                "premise": premise.strip(),
                "text": text,
                "path": str(entry),
            }
        )
    return rows
