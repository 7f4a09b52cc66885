"""Synthetic query → positive pairs for scale tests: ``train.jsonl``, ``val.jsonl`` and ``test.jsonl`` (one JSON
object a line: ``anchor``, ``positive``, ``group``), made of generated words only (no third-party text), deterministic
by seed.

    python scripts/make_synthetic_pairs.py --pairs 30000 --out data/synthetic-30k [--seed 0]

How hard retrieval is, by construction:

* every pair has its own ``--keys`` content words; the anchor holds all of them, the positive a share ``--overlap``
  of them (the rest of each text is other words), so the positive is findable by its words but not trivially;
* every pair belongs to a ``group`` (a topic, ~``--group-size`` pairs) whose topic words both texts use: the other
  pairs of a group are the hard negatives, sharing words with the query that are not its positive's own;
* filler words are drawn from a Zipf-like head of common words, as in real text, so TF-IDF has stop words to discount;
* a share ``--shared`` of pairs take the positive of another pair of the same split (one answer to two questions:
  the duplicate positive texts that deduplication and the pool rule must handle).

The pairs are split ``--fractions`` (default 0.6 / 0.2 / 0.2, ArguAna's proportions) after a seeded shuffle; groups
cross splits. Standard library and numpy only.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

SPLITS = ("train", "val", "test")
CONSONANTS = list("bdfgklmnprstvz") + ["ch", "sh", "th", "tr", "pl", "kr"]
VOWELS = list("aeiou") + ["ai", "ou", "ea"]


def vocabulary(rng: np.random.Generator, size: int) -> np.ndarray:
    """``size`` distinct made-up words of 2-4 consonant-vowel syllables, in a seeded order."""
    words: dict[str, None] = {}
    while len(words) < size:
        n = size - len(words)
        syllables = rng.integers(2, 5, n)
        cons = rng.integers(0, len(CONSONANTS), (n, 4))
        vows = rng.integers(0, len(VOWELS), (n, 4))
        for k, c, v in zip(syllables, cons, vows, strict=True):
            words.setdefault("".join(CONSONANTS[c[i]] + VOWELS[v[i]] for i in range(k)))
    return np.array(list(words)[:size])


def zipf(n: int) -> np.ndarray:
    """[n] probabilities that fall as 1 / rank: the word frequencies."""
    w = 1.0 / np.arange(1, n + 1)
    return w / w.sum()


def make_pairs(
    n_pairs: int,
    seed: int = 0,
    keys: int = 6,
    overlap: float = 0.5,
    group_size: int = 50,
    length: int = 24,
    vocab_size: int = 40000,
) -> list[dict[str, str]]:
    """``n_pairs`` pairs ``{"anchor", "positive", "group"}`` in generation order (see the module docstring)."""
    rng = np.random.default_rng(seed)
    words = vocabulary(rng, vocab_size)
    n_common = 400  # words[:400] are the common fillers, the rest content words
    content = np.arange(n_common, vocab_size)
    n_groups = max(1, n_pairs // group_size)
    topics = rng.choice(content, (n_groups, 16))  # each group's 16 topic words
    group = rng.integers(0, n_groups, n_pairs)
    # each pair's own words, Zipf-distributed over the content words: frequent ones recur in many pairs
    own = rng.choice(content, (n_pairs, keys), p=zipf(len(content)))
    kept = max(1, round(overlap * keys))
    repeated = np.take_along_axis(own, rng.random((n_pairs, keys)).argsort(axis=1)[:, :kept], axis=1)
    texts = []
    for head in (own, repeated):  # the anchors hold all of a pair's own words, the positives `kept` of them
        topic = np.take_along_axis(topics[group], rng.integers(0, 16, (n_pairs, 5)), axis=1)
        # other content words, then common fillers up to the length: what keeps the positive from being obvious
        noise = rng.choice(content, (n_pairs, 4), p=zipf(len(content)))
        fill = rng.choice(n_common, (n_pairs, max(0, length - head.shape[1] - 9)), p=zipf(n_common))
        rows = rng.permuted(np.concatenate([head, topic, noise, fill], axis=1), axis=1)
        texts.append([" ".join(words[row]) for row in rows])
    return [{"anchor": a, "positive": p, "group": f"g{g:05d}"} for a, p, g in zip(*texts, group, strict=True)]


def split_pairs(
    pairs: list[dict], seed: int, fractions: tuple[float, float, float], shared: float
) -> dict[str, list[dict]]:
    """The pairs shuffled (seeded) and cut into train/val/test by ``fractions``; in each split a share ``shared`` of
    pairs take the positive of another pair of the same group and split, where the group has another."""
    rng = np.random.default_rng([seed, 1])
    order = rng.permutation(len(pairs))
    cuts = np.cumsum(np.round(np.asarray(fractions) / sum(fractions) * len(pairs)).astype(int))[:2]
    out = {}
    for name, part in zip(SPLITS, np.split(order, cuts), strict=True):
        rows = [dict(pairs[i]) for i in part]
        by_group: dict[str, list[int]] = {}
        for j, row in enumerate(rows):
            by_group.setdefault(row["group"], []).append(j)
        for j in np.flatnonzero(rng.random(len(rows)) < shared):
            others = [o for o in by_group[rows[j]["group"]] if o != j]
            if others:
                rows[j]["positive"] = rows[int(rng.choice(others))]["positive"]
        out[name] = rows
    return out


def write_jsonl(rows: list[dict], path: Path) -> None:
    with open(path, "w", encoding="utf-8") as file:
        for row in rows:
            file.write(json.dumps(row, ensure_ascii=False) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, required=True, help="pairs in all three splits together")
    parser.add_argument("--out", type=Path, required=True, help="folder for train.jsonl, val.jsonl, test.jsonl")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fractions", type=float, nargs=3, default=(0.6, 0.2, 0.2), metavar=("TRAIN", "VAL", "TEST"))
    parser.add_argument("--keys", type=int, default=6, help="a pair's own content words (all in the anchor)")
    parser.add_argument("--overlap", type=float, default=0.5, help="share of them the positive repeats")
    parser.add_argument("--group-size", type=int, default=50, help="pairs per group (topic) on average")
    parser.add_argument("--length", type=int, default=24, help="words per text")
    parser.add_argument("--shared", type=float, default=0.002, help="share of pairs given another pair's positive")
    args = parser.parse_args(argv)
    if args.pairs < 6:
        print(f"--pairs {args.pairs}: use at least 6 (2 per split)", file=sys.stderr)
        return 2
    if not 0 < args.overlap <= 1:
        print(f"--overlap {args.overlap}: use a share in (0, 1]", file=sys.stderr)
        return 2
    pairs = make_pairs(args.pairs, args.seed, args.keys, args.overlap, args.group_size, args.length)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, rows in split_pairs(pairs, args.seed, tuple(args.fractions), args.shared).items():
        write_jsonl(rows, args.out / f"{name}.jsonl")
        print(f"{args.out / f'{name}.jsonl'}: {len(rows)} pairs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
