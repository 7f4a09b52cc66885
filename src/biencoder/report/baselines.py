"""Does a cell beat the untrained encoder? Every cell against zero-shot and TF-IDF on the same test queries
(``plot_top1.py <sweep> --baselines [all|unseen|seen]``).

For each cell, the per-query test top-1 of its finished runs at the best val epoch (``test_hits.npy``) is compared
with the zero-shot encoder's cosine and TF-IDF top-1 of the same queries and pools (the epa task = the per-epoch
pool), by the paired bootstrap of :mod:`biencoder.report.statistics` (seeds, then queries, with 3+ seeds), one Holm
family over every row. Each run's baseline is computed from that run's own config: its test split (corpus, dedup,
max_debates), its encoder (the same seed as the runner, so a ``random_init`` encoder is the run's own), pooling and
max_length; runs that share all of these share one computation. The pooled vectors come from the embedding cache
(``trainer.cache_dir``; a frozen-encoder run filled it) or are encoded once into it. ``unseen`` / ``seen`` keep
the test queries whose texts do not / do occur in a training or validation pair the run used (``test_seen.npy``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from ..engine.data.corpus import run_splits
from ..engine.machine.runtime import set_seed_everywhere
from ..engine.modeling.encoding import TextEncoder, pooled_vectors
from ..engine.modeling.model import build_model
from ..engine.retrieval.metrics import Ranks, top1_hits
from ..engine.retrieval.official_tasks import BASELINES, baseline_ranks
from ..engine.retrieval.rerank import query_sample
from . import SummaryError
from .runs import QUERY_GROUPS, Run
from .statistics import ALPHA, MC_Z, MIN_SEEDS_FOR_SEED_LEVEL, N_BOOT, p_text, paired_bootstrap, verdicts


def _group(run: Run, prefix: str) -> dict:
    """The run's settings under ``prefix`` (``model.``) as a nested dict, schema defaults filled in for keys the run
    predates (:func:`biencoder.engine.config.settings.run_settings`)."""
    out: dict = {}
    for key, value in run.flat.items():
        if key.startswith(prefix):
            *parents, leaf = key[len(prefix) :].split(".")
            node = out
            for parent in parents:
                if not isinstance(node.get(parent), dict):  # a default of None (random_init) under a set dict
                    node[parent] = {}
                node = node[parent]
            if not isinstance(node.get(leaf), dict):
                node[leaf] = value
    return out


def _key(run: Run) -> str:
    """What a run's baselines depend on: its data and model settings (not the head), its sample of test queries
    (``eval.test_queries``) and, for a randomly initialised encoder, its seed."""
    model = {k: v for k, v in _group(run, "model.").items() if k != "head"}
    seeded = bool(model["encoder"].get("random_init"))
    return json.dumps(
        [_group(run, "data."), model, run.flat.get("eval.test_queries"), run.seed if seeded else None],
        sort_keys=True,
        default=str,
    )


#: the keys of a run's config the baselines read beyond those with a schema default (a hand-made config may lack them)
NEEDED = ("model.encoder.name_or_path", "model.max_length", "trainer.cache_dir")


def baseline_hits(
    run: Run,
    memo: dict[str, dict[str, np.ndarray]] | None = None,
    data_root: str | None = None,
    encoder: str | None = None,
) -> dict[str, np.ndarray]:
    """``{"encoder_cosine": [P] bool, "tfidf": [P] bool}``: whether each test query of ``run``'s split (all, or its
    ``eval.test_queries`` sample, as its ``test_hits.npy``) has its true counter first under the baseline. ``memo``
    (key: :func:`_key`) shares the work between runs. ``data_root`` and ``encoder`` replace the run's ``data.root``
    and ``model.encoder.name_or_path`` (runs copied from another machine, whose paths do not exist here). Raises
    :class:`SummaryError` when the run's config lacks a key of :data:`NEEDED`."""
    memo = {} if memo is None else memo
    missing = [k for k in NEEDED if k not in run.flat and not (encoder and k == "model.encoder.name_or_path")]
    if missing:
        raise SummaryError(
            f"{run.path}: its config has no {', '.join(missing)}, which the baselines need (biencoder.train writes "
            "them in config_resolved.yaml)"
        )
    key = _key(run)
    if key not in memo:
        data, model_cfg = _group(run, "data."), _group(run, "model.")
        data["root"] = data_root or data["root"]
        model_cfg["encoder"]["name_or_path"] = encoder or model_cfg["encoder"]["name_or_path"]
        split = run_splits(data)[1]["test"]  # the ArguAna folders or the run's pair files, its dedup and pool
        set_seed_everywhere(run.seed)  # as the runner does before building the model: the same random_init encoder
        model, tokenizer = build_model(model_cfg, progress=False)
        with torch.no_grad():
            encoder = TextEncoder(model, tokenizer, model_cfg["max_length"], cache_dir=run.flat["trainer.cache_dir"])
            pooled = pooled_vectors(encoder, split.texts)
        pairs = query_sample(split.n_pairs, run.flat.get("eval.test_queries"))  # the run's own test queries
        memo[key] = {name: top1_hits(Ranks(rank)) for name, rank in baseline_ranks(split, pooled, pairs).items()}
    return memo[key]


def _kept(run: Run, queries: str, n: int) -> np.ndarray:
    """[Q] bool: the test queries of ``run`` in the group ``queries`` (one of :data:`QUERY_GROUPS`)."""
    if queries not in QUERY_GROUPS:
        raise SummaryError(f"--baselines {queries} is not valid: use one of {', '.join(QUERY_GROUPS)}")
    if queries == "all":
        return np.ones(n, bool)
    if run.seen is None or len(run.seen) != n:
        raise SummaryError(
            f"{run.path} has no test_seen.npy for its {n} test queries: --baselines {queries} needs "
            "runs that recorded which test queries they saw; use --baselines all"
        )
    return ~run.seen if queries == "unseen" else run.seen


def _recorded(run: Run, score: str, queries: str) -> float | None:
    """The baseline's top-1 on these queries as the run recorded it in final.json, if it did."""
    recorded = (run.final or {}).get("baselines", {}).get("test", {}).get(score, {})
    return recorded.get("top1" if queries == "all" else f"top1_{queries}")


@dataclass
class _Cell:
    """One cell of :func:`baseline_table`: its finished runs, the test queries kept of each ([Q] bool) and the runs'
    hits on those ([S, kept] float)."""

    name: str
    members: list[Run]
    keep: list[np.ndarray]
    hits: np.ndarray


def _cell_rows(cell: _Cell, base: list[dict[str, np.ndarray]], queries: str, n_boot: int) -> list[dict]:
    """The rows of :func:`baseline_table` for one cell, one per baseline; ``base``: :func:`baseline_hits` of each
    member run. Raises :class:`SummaryError` when a baseline's test split does not have the runs' queries."""
    rows = []
    for score, name in BASELINES.items():
        if any(len(b[score]) != len(r.hits) for b, r in zip(base, cell.members, strict=True)):
            raise SummaryError(
                f"{cell.name}: the test split rebuilt from the runs' config does not have the queries "
                "of their test_hits.npy: is data.root still the corpus the runs used?"
            )
        other = np.stack([b[score][k] for b, k in zip(base, cell.keep, strict=True)]).astype(float)
        diff, low, high, p = paired_bootstrap(cell.hits, other, n_boot)
        recorded = [v for v in (_recorded(r, score, queries) for r in cell.members) if v is not None]
        rows.append(
            {
                "cell": cell.name,
                "seeds": len(cell.members),
                "queries": int(cell.keep[0].sum()),
                "of": len(cell.keep[0]),
                "test_top1": cell.hits.mean(),
                "vs": name,
                "vs_top1": other.mean(),
                "vs_top1_recorded": float(np.mean(recorded)) if recorded else np.nan,
                "diff": diff,
                "ci_low": low,
                "ci_high": high,
                "p": p,
                "ci_resamples": "seeds+queries" if len(cell.members) >= MIN_SEEDS_FOR_SEED_LEVEL else "queries",
            }
        )
    return rows


def baseline_table(
    runs: list[Run],
    queries: str = "all",
    n_boot: int = N_BOOT,
    data_root: str | None = None,
    encoder: str | None = None,
) -> pd.DataFrame:
    """One row per (cell, baseline): the cell's test top-1 on ``queries`` against the baseline's on the same ones.

    Columns: cell, seeds, queries (kept), of (test queries), test_top1, vs (zero-shot | TF-IDF), vs_top1 (computed
    here), vs_top1_recorded (what the runs' final.json say, mean over the cell's runs; NaN if none), diff, ci_low,
    ci_high, p, p_low / p_high (its Monte Carlo range), ci_resamples, p_holm (over every row) with p_holm_low /
    p_holm_high, verdict (:func:`~biencoder.report.statistics.verdict`: "at the line" when the adjusted range
    straddles α). ``data_root`` / ``encoder``: see
    :func:`baseline_hits`. Raises :class:`SummaryError` when no run finished
    with ``test_hits.npy``.
    """
    complete = [r for r in runs if r.complete and r.hits is not None]
    if not complete:
        raise SummaryError(
            "no finished run with test_hits.npy to compare with the baselines: wait for the runs, or "
            "resume them with trainer.resume=true"
        )
    memo: dict[str, dict[str, np.ndarray]] = {}
    rows = []
    for name in sorted({r.cell for r in complete}):
        members = [r for r in complete if r.cell == name]
        keep = [_kept(r, queries, len(r.hits)) for r in members]
        hits = np.stack([r.hits[k] for r, k in zip(members, keep, strict=True)]).astype(float)  # [S, kept]
        base = [baseline_hits(r, memo, data_root, encoder) for r in members]
        rows += _cell_rows(_Cell(name, members, keep, hits), base, queries, n_boot)
    out = pd.DataFrame(rows)
    for column, values in verdicts(out["diff"], out["p"], n_boot).items():
        out[column] = values
    out["resamples"] = n_boot
    return out


def baseline_markdown(table: pd.DataFrame, queries: str) -> str:
    """:func:`baseline_table` as Markdown, with what the numbers are."""
    lines = [
        f"| cell | seeds | test queries ({queries}) | test top1 | vs | vs top1 | Δ | 95% CI | p [MC range] | "
        f"p (Holm, {len(table)}) [MC range] | verdict (α={ALPHA:g}) |",
        "|" + "---|" * 11,
    ]
    for _, r in table.iterrows():
        shown = f"{r['vs_top1']:.3f}"
        if not pd.isna(r["vs_top1_recorded"]) and f"{r['vs_top1_recorded']:.3f}" != shown:
            shown += f" (runs recorded {r['vs_top1_recorded']:.3f})"
        lines.append(
            f"| {r['cell']} | {r['seeds']} ({r['ci_resamples']}) | {r['queries']} of {r['of']} | "
            f"{r['test_top1']:.3f} | {r['vs']} | {shown} | {r['diff']:+.3f} | "
            f"[{r['ci_low']:+.3f}, {r['ci_high']:+.3f}] | {p_text(r['p'], r['p_low'], r['p_high'])} | "
            f"{p_text(r['p_holm'], r['p_holm_low'], r['p_holm_high'])} | {r['verdict']} |"
        )
    lines.append(
        "\nΔ: the cell's test top-1 at the best val epoch minus the baseline's on the same test queries and "
        "pools (the epa task); zero-shot: cosine of the untrained encoder's pooled vectors (the cell's own "
        "model config); TF-IDF: fit on the split's texts. 95% CI and p: paired bootstrap over seeds and "
        f"queries with {MIN_SEEDS_FOR_SEED_LEVEL}+ seeds, over queries only with fewer, "
        f"{int(table['resamples'].iloc[0]):,} resamples; [MC range]: ±{MC_Z:g} Monte Carlo standard errors "
        "of p; Holm over every row. Verdict: better / worse when the whole adjusted range is below α, at the "
        "line when it straddles α."
    )
    return "\n".join(lines)
